"""The wire schema, splitspec.proto, and the code `python -m protos.generate` makes from it."""
