"""Argparse glue for the ``splitspec`` command groups; the work lives in the packages they import."""
