"""Benchmark workloads behind `make bench`."""
