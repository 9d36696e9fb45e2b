"""A SLURM job's agent counts its own node's cores for the ranks' threads
(dtrain_cli/cli/agent_cmd.py): the plan was made where the job was submitted."""

from __future__ import annotations

import os

from dtrain_cli.cli.agent_cmd import threads_of_this_node
from dtrain_cli.config.compose import compose_config
from dtrain_cli.plan.build import Resources, build_plan


def _plan(*over: str):
    cfg = compose_config("gpt_tiny", ["dp=2", *over])
    return cfg, build_plan(cfg, Resources(num_gpus=0, num_cpus=64))  # a login node's cores


def test_a_jobs_ranks_take_the_cores_the_job_was_given(monkeypatch):
    """Planned on 64 cores: 32 threads a rank; the job's node gave 2 CPUs (a new user's
    find: 2 threads a rank on 1 CPU ran 7-20x slower than on one node)."""
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    cfg, plan = _plan()
    assert plan.threads_per_proc == 32
    assert threads_of_this_node(cfg, plan).threads_per_proc == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert threads_of_this_node(cfg, plan).threads_per_proc == 8


def test_what_the_user_set_and_runs_outside_slurm_keep_the_plans(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    cfg, plan = _plan("launcher.threads_per_proc=4")
    assert threads_of_this_node(cfg, plan).threads_per_proc == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the job's own
    cfg, plan = _plan()
    assert threads_of_this_node(cfg, plan) is plan
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("SLURM_JOB_ID")  # a pod: its CPU limit is a quota, not the mask
    assert threads_of_this_node(cfg, plan) is plan


def test_the_jobs_cpu_count_bounds_an_unbound_nodes_cores(monkeypatch):
    """A cluster that binds no CPUs shows the agent the whole shared node: SLURM's count of
    the job's CPUs there bounds it; cluster.cpus_per_task planned it already (a review's
    find)."""
    monkeypatch.setenv("SLURM_JOB_ID", "6")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "8")
    cfg, plan = _plan()
    assert threads_of_this_node(cfg, plan).threads_per_proc == 4
    cfg, plan = _plan("cluster.cpus_per_task=6")
    assert threads_of_this_node(cfg, plan) is plan
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # set but empty: not the user's count
    cfg, plan = _plan()
    assert threads_of_this_node(cfg, plan).threads_per_proc == 4
