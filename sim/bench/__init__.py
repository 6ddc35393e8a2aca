"""Benchmarks that print numbers, each against a baseline measured in the same run."""
