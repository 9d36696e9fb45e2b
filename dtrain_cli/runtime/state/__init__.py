"""What a step changes and a checkpoint keeps: optimizers and the LR schedule, mixed
precision and loss scaling, DCP save/load with RNG state.
"""
