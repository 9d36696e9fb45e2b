"""Activation checkpointing under torch.compile (its inductor runs a C++ compiler: not a
unit test). The unit case: tests/unit/test_activation_checkpoint.py."""

from __future__ import annotations

from tests.unit.test_activation_checkpoint import batchnorm_counts_each_batch_once


def test_a_compiled_block_with_batchnorm_counts_each_batch_once():
    """train.compile=true compiles each checkpointed block: a context_fn that keeps the
    running statistics made step 1 fail there (a review's find); compiled, the
    recomputation is part of the graph and counts each batch once by itself."""
    batchnorm_counts_each_batch_once(compiled=True)
