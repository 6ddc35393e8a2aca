"""Code both sides of the split need: numpy only, no model calls.

Holds the slow, obvious reference for logit processing, counter-based noise,
verification and sparse draft distributions (``cloud/`` has the fast torch
path that is tested against it), the payload codec, the wire contract
(``wire``), sampling parameters and product defaults (``params``), counters
(``stats``), and what every command line shares (``cli``: the one module
here that does I/O, printing errors).
"""
