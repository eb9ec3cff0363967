"""The speed-quality frontier of every decoding mode on the shipped digits model (docs/measurements.md).

    python benchmarks/frontier_digits.py    # = csd sweep --model digits --seeds 5 --out docs/img/digits_frontier

ar, sjd (independent / maximal / gumbel next drafts), gsd, and csd over λ ∈ {0, 0.05, 0.1, 0.25, 0.5, 1} ×
τ ∈ {0.3, 0.65, 1} × coupling {independent, maximal}; 8 images of each class per seed, seeds 0-4 (five, so that
ar's seed-to-seed spread, the band, is itself measured), batches of 16. Writes docs/img/digits_frontier.{json,csv,
png}; see csd_kernels/bench/frontier.py for what is measured.
"""

import sys

from csd_kernels import cli

if __name__ == "__main__":
    sys.exit(cli.main(["sweep", "--model", "digits", "--seeds", "5", "--out", "docs/img/digits_frontier",
                       *sys.argv[1:]]))
