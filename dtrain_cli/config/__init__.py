"""Composition (Hydra) and validation of the typed run config. Torch-free.

Nothing is imported here, so importing one submodule (say ``config.errors`` from the CLI)
does not pull Hydra in: ``dtrain --help`` stays fast.
"""
