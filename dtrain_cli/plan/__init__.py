"""The Plan: a pure, torch-free description of a run derived from its config."""

from dtrain_cli.plan.build import Resources, build_plan
from dtrain_cli.plan.plan import Plan

__all__ = ["Plan", "Resources", "build_plan"]
