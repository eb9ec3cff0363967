"""Measurement tools of the ``csd`` command: op.py (``csd bench``: the verify op's microbenchmarks, whose
pytest-benchmark cases are cases.py, run by path), frontier.py + frontier_plot.py (``csd sweep``: the speed-quality
frontier)."""
