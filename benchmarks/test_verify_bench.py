"""The verify microbenchmarks for ``pytest benchmarks/ --benchmark-json=OUT.json`` (the cases live in
csd_kernels/bench/cases.py so that ``csd bench`` has them in an installed package; settings: see that module)."""

from csd_kernels.bench.cases import test_authors_loop, test_read_once, test_verify  # noqa: F401
