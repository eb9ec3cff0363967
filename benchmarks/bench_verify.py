"""Time the verify op on every available backend at Janus-like and Lumina-like shapes (= ``csd bench``).

    python benchmarks/bench_verify.py [--device cuda] [--backends cpu torch] [--quick] [--out benchmarks/results]

pytest-benchmark cases (csd_kernels/bench/cases.py: per shape, the read-once floor, the CSD authors' loop and every
backend), their raw JSON in OUT/benchmark.json, and from it a table and verify.json / verify.csv / verify.png: time
per call, its ratio to reading the inputs once and its speed-up over the authors' per-position Python loop.
"""

import sys

from csd_kernels.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
