"""Ops the Triton kernels execute per acceptance rule, against the strict rule's, counted in Triton's interpreter.

    python benchmarks/rules_ops.py [--batches 1,8] [--rules strict,gsd,...] [--out FILE.json]

The interpreter (TRITON_INTERPRET=1, on the CPU) runs every program of the grid; each block-level operation it
builds (``InterpreterBuilder.create_*``: loads, stores, arithmetic, comparisons, gathers, casts, ...) is counted once
per program, whatever the block's width, so the count is the instruction stream a GPU would issue per program summed
over the grid (reductions and scans, a handful per program, are not counted). Inputs as benchmarks/rules_speed.py:
(B, L, V) = (1, 16, 16384) and (8, 16, 16384), fp32 logits with CFG, q a noisy copy of p, each rule at its defaults,
lantern also with ``gather_distortion=True``. The count is deterministic: no timing is involved.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton and the kernels are imported

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import rules_speed  # noqa: E402

import csd_kernels as ck  # noqa: E402

COUNTS: collections.Counter = collections.Counter()


def _counting(name, method):
    def wrapped(*args, **kwargs):
        COUNTS[name] += 1
        return method(*args, **kwargs)

    return wrapped


def install_counter() -> None:
    """Wraps every create_* method of the interpreter's builder with a counter (COUNTS)."""
    cls = interpreter.InterpreterBuilder
    for name in dir(cls):
        if name.startswith("create_") and callable(getattr(cls, name)):
            setattr(cls, name, _counting(name, getattr(cls, name)))


def measure(batches=rules_speed.BATCHES, labels=None) -> list[dict]:
    """Rows of (B, rule, ops, vs_strict) for ``batches`` and the calls named in ``labels`` (default: every call of
    rules_speed.calls; strict is always counted, as the ratios' base)."""
    g = torch.Generator().manual_seed(7)
    neighbours = ck.codebook_neighbours(torch.randn(rules_speed.VOCAB, 8, generator=g), 1000)
    calls = rules_speed.calls(neighbours)
    unknown = set(labels or ()) - set(calls)
    if unknown:
        raise SystemExit(f"--rules: unknown {sorted(unknown)}; choose from {', '.join(calls)}")
    chosen = {label: kw for label, kw in calls.items() if labels is None or label in labels or label == "strict"}
    rows = []
    for batch in batches:
        x = rules_speed.inputs(batch)
        ops = {}
        for label, kw in chosen.items():
            COUNTS.clear()
            ck.verify(**x, **kw, backend="triton")
            ops[label] = sum(COUNTS.values())
            print(f"{batch:>2} {label:<20} {ops[label]:>10}", flush=True)  # as it goes: the interpreter is slow
        for label, n in ops.items():
            rows.append(dict(B=batch, L=rules_speed.WINDOW, V=rules_speed.VOCAB, rule=label, ops=n,
                             vs_strict=n / ops["strict"]))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--batches", default=",".join(map(str, rules_speed.BATCHES)),
                        help="comma-separated batch sizes (default %(default)s)")
    parser.add_argument("--rules", help="comma-separated calls to count, as labelled in the table (default: all; "
                                        "'lantern +distortion' runs for more than 10 minutes)")
    args = parser.parse_args(argv)
    install_counter()
    rows = measure([int(b) for b in args.batches.split(",")], args.rules.split(",") if args.rules else None)
    print(f"{'B':>2} {'rule':<20} {'ops':>10} {'/ strict':>9}")
    for r in rows:
        print(f"{r['B']:>2} {r['rule']:<20} {r['ops']:>10} {r['vs_strict']:>9.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
