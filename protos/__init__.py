"""The wire schema (splitspec.proto) and the Python code generated from it by ``python -m protos.generate``."""
