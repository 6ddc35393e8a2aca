"""Code both sides of the split need: numpy only, no model calls, no I/O.

Holds the slow, obvious reference for logit processing, counter-based noise,
verification and sparse draft distributions; ``cloud/`` has the fast torch
path that is tested against it.
"""
