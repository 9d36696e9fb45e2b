"""The vocabulary of a layout: the device mesh's axes, the degrees along them
(:class:`~.dims.ParallelDims`) and the pipeline schedules by name. Torch-free; imports nothing.
"""
