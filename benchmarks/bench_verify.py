"""Time the verify op on every available backend at Janus-like and Lumina-like shapes.

    python benchmarks/bench_verify.py [--device cuda] [--out benchmarks/results]

Prints a table and writes verify.json / verify.csv / verify.png: time per call, its ratio to reading the inputs once
(torch.sum over the same tensors) and its speed-up over the CSD authors' per-position Python loop.
"""

import argparse
import platform

import torch

from csd_kernels import bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--backends", nargs="*", help="default: every available backend (not Triton's interpreter)")
    args = parser.parse_args()
    cpu_name = f"{platform.processor() or 'cpu'}, {torch.get_num_threads()} threads"
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else cpu_name
    rows = bench.run(backends=args.backends, device=args.device, repeats=args.repeats)
    print(bench.format_table(rows))
    for name, path in bench.save(rows, args.out, device_name).items():
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
