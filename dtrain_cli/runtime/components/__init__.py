"""The loop's components, each deciding its own cadence: checkpointer, validator, metrics and
their sinks, numerics, replica checks, profiling, preemption, elastic membership.
"""
