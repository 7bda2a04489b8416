"""Benchmarks: each times a naive baseline and the fast path in one process and prints the ratio. Run them from the
repository root as modules, e.g. `python -m bench.train`."""
