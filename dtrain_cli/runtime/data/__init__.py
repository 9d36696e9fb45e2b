"""This rank's batches: the global sample stream over the prepared corpus, the DataLoader
that feeds it, and the built-in images (corpora themselves: :mod:`dtrain_cli.corpus`).
"""
