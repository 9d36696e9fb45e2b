"""Token corpora and datasets, prepared once by the launcher before workers start: the
built-in and text corpora, HF files, your ``_target_`` dataset. Torch-free (numpy).
"""
