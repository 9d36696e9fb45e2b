"""``dtrain run train.py``: one rank of your own script, as ``python train.py`` under torchrun
would run it, and the arrival check around its ``init_process_group``.
"""
