"""The runtime half of each sync mode (``sync.mode``): what an optimizer step means when
replicas step alone (local SGD, DiLoCo) or a parameter server holds the model.
"""
