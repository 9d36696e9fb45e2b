"""The worker side: one rank's start-up and training loop (imports torch).

Owns: the worker entry, the trainer, the step runners; its rooms hold the rest. May import
config, plan, models, strategies, sync_modes, rundir, corpus, checkpoint; never cli or launch.
"""
