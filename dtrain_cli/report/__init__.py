"""Reading finished runs: ``dtrain report`` (plots of one run), ``dtrain compare`` (runs
step by step). Torch-free; matplotlib is imported only when plotting."""
