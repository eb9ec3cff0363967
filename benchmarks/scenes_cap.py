"""A cap on the distortion (issue 48, ``max_distortion``) on the scenes model: csd+maximal (λ 0.5, τ 0.65) in the
static chain with fresh drafts from the row above, without a cap and with caps between 0.02 and 0.3, beside
sjd+maximal (lossless) and csd with a cap of 0 (lossless too: sjd's tokens), on the texture prompts and seeds of the
frontier (csd_kernels.bench.frontier.run_setting: batches of 16 rows, seed 0).

Each setting appends one record to ``OUT.jsonl`` as it finishes (a cut run keeps what it measured); the table gives
passes per image ± standard error, × fewer than ar (576 tokens), the paired difference to sjd (each image's passes
minus sjd's on the same prompt and seed), the mean distortion per token and the model's quality measures.

    OMP_NUM_THREADS=1 python benchmarks/scenes_cap.py [--images 96] [--caps none,0.3,0.1,0.05,0.02,0] [--window 16]
        [--out docs/img/cap_scenes_w16]
    python benchmarks/scenes_cap.py --report docs/img/cap_scenes_w16.jsonl
"""
import argparse
import json
import time

import numpy as np

from csd_kernels.bench import frontier
from csd_kernels.zoo import measurement_prompts

AR_PASSES = 576
QUALITY = ("adherence", "frechet", "background_accuracy")  # the scenes model's measures (zoo)


def _setting(cap, window: int) -> frontier.Setting:
    common = dict(coupling="maximal", static=True, window=window)
    if cap == "sjd":
        return frontier.Setting("sjd+maximal", "sjd", params=(("draft_init", "above"),), **common)
    params = (("draft_init", "above"),) + (() if cap is None else (("max_distortion", cap),))
    label = "csd+maximal λ=0.5 τ=0.65" + ("" if cap is None else f" cap={cap:g}")
    return frontier.Setting(label, "csd", entropy_coef=0.5, tvd_threshold=0.65, params=params, **common)


def report(path: str) -> str:
    records = [json.loads(line) for line in open(path)]
    base = next((np.asarray(r["row_passes"]) for r in records if r["cap"] == "sjd"), None)
    names = [m for m in QUALITY if any(m in r for r in records)]
    lines = [f"{'setting':32s} {'images':>6s} {'passes':>15s} {'× fewer':>8s} {'paired vs sjd':>22s} "
             f"{'distortion':>10s} " + " ".join(f"{m:>16s}" for m in names)]
    for r in records:
        passes = np.asarray(r["row_passes"])
        se = passes.std(ddof=1) / np.sqrt(len(passes))
        diff = ""
        if base is not None and r["cap"] != "sjd" and len(base) == len(passes):
            d = passes - base
            diff = f"{d.mean():+.1f} ± {d.std(ddof=1) / np.sqrt(len(d)):.1f} ({d.mean() / base.mean():+.1%})"
        quality = " ".join(f"{r[m]:8.3f} ± {r.get(m + '_se', float('nan')):5.3f}" for m in names)
        lines.append(f"{r['setting']:32s} {len(passes):6d} {passes.mean():7.1f} ± {se:4.1f} "
                     f"{AR_PASSES / passes.mean():7.2f}× {diff:>22s} {r['distortion']:10.4f} {quality}")
    return "\n".join(lines)


def _parse_cap(text: str):
    """"sjd", "none" (csd without a cap) or a cap."""
    return text if text == "sjd" else None if text == "none" else float(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--caps", default="sjd,none,0.3,0.1,0.05,0.02,0", help="comma-separated: sjd, none or a cap")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--out", default="docs/img/cap_scenes_w16")
    parser.add_argument("--report", default=None, help="print the table of this jsonl and stop")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    import torch

    torch.set_num_threads(1)
    prompts = measurement_prompts("scenes", images=args.images)
    out = args.out + ".jsonl"
    for text in args.caps.split(","):
        cap = _parse_cap(text)
        setting = _setting(cap, args.window)
        begin = time.perf_counter()
        record = frontier.run_setting("scenes", setting, 0, prompts)
        record = dict(setting=setting.label, cap=cap, window=args.window, images=len(prompts),
                      seconds=time.perf_counter() - begin, **record)
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"{setting.label}: {record['passes']:.1f} passes/image, {record['seconds']:.0f} s", flush=True)
    print(report(out))


if __name__ == "__main__":
    main()
