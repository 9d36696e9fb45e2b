"""How a model is laid out over the mesh: the mesh itself, parallelize, data-parallel
wrappers, pipeline stages, activation checkpointing, synchronized BatchNorm, DTensor helpers.
"""
