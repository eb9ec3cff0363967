"""CPU seconds of ``import csd_kernels`` (bare, and with its public names loaded), of ``csd --version``, against
``import torch``, each in a fresh interpreter.

    python benchmarks/import_cost.py [--runs 7]

The two statements alternate run by run (so a change in the machine's load hits both); each run's CPU seconds are
the child's user + system time, which depend less on other processes than wall time does. Prints the medians, the
ratio and the load average at the start and the end.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys

STATEMENTS = {
    "torch": "import torch",
    "csd_kernels": "import csd_kernels",
    "csd_kernels names": "import csd_kernels as ck\nfor name in ck.__all__: getattr(ck, name)",
    "csd --version": "import sys; sys.argv = ['csd', '--version']\nfrom csd_kernels.cli import main\nmain()",
}


def cpu_seconds(statement: str) -> float:
    """User + system CPU seconds of a fresh ``python -c statement``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", statement], check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    cpu_seconds("import csd_kernels")  # warm the file cache
    times = {name: [] for name in STATEMENTS}
    for _ in range(args.runs):
        for name, statement in STATEMENTS.items():
            times[name].append(cpu_seconds(statement))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:18s} median {medians[name]:.2f} CPU s  (min {min(values):.2f}, max {max(values):.2f}, "
              f"{args.runs} runs)")
    ratios = ", ".join(f"{name} {medians[name] / medians['torch']:.2f}" for name in STATEMENTS if name != "torch")
    print(f"/ import torch: {ratios}; load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
