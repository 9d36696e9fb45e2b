"""``dtrain simulate``'s torch-free half: which ranks, what each should hold, the report.

The runtime half (:mod:`dtrain_cli.runtime.simulate`) runs one rank in its own process.
"""
