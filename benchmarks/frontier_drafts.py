"""Fresh drafts side by side (``draft_init``: uniform, the token above, drawn from p above) on the frontier's prompts
and seeds: every setting once per draft_init, the passes per image ± standard error and the paired difference to
uniform (same prompts, same row seeds: the difference of each image's passes, ± its standard error), the model's
quality measures beside them (docs/measurements.md, "Drafts from the row above").

Each (setting, draft_init) is one job of csd_kernels.bench.frontier.run_setting (batches of 16 rows, one seed); a job
is appended to ``OUT.jsonl`` as it finishes, so a cut run keeps what it measured; ``--report`` prints the table of a
(partial) jsonl.

    python benchmarks/frontier_drafts.py --model scenes --images 96 --settings sjd+maximal,csd \
        --inits uniform,above [--window 16] [--workers 2] [--out docs/img/drafts_scenes_w16]
    python benchmarks/frontier_drafts.py --report docs/img/drafts_scenes_w16.jsonl
    python benchmarks/frontier_drafts.py --timing 8 --settings sjd+maximal,csd --inits uniform,above,above-p

``--timing N``: instead, CPU seconds per image at B = 1 (the eager loop as shipped, one torch thread, this process's
CPU time: the work, whatever else runs on the machine) on the first N prompts, calls interleaved (image i by every
setting and draft_init in turn, after one warm-up call each), beside the passes.
"""
import argparse
import json
import multiprocessing

import numpy as np

from csd_kernels.bench import frontier
from csd_kernels.config.acceptance import GRID_RULES
from csd_kernels.zoo import measurement_prompts


def named_settings(window: int | None, vocab: int) -> dict:
    """Every setting the comparison can name: ar, sjd with each coupling, csd at the defaults (λ 0.5, τ 0.65, maximal
    and independent next drafts), gsd and every other relaxed rule at its defaults."""
    table = {"ar": frontier.Setting("ar", "ar")}
    for c in frontier.SJD_COUPLINGS:
        table[f"sjd+{c}"] = frontier.Setting(f"sjd+{c}", "sjd", c, window=window)
    table["csd"] = frontier.Setting("csd+maximal λ=0.5 τ=0.65", "csd", "maximal", 0.5, 0.65, window=window)
    table["csd+independent"] = frontier.Setting("csd+independent λ=0.5 τ=0.65", "csd", "independent", 0.5, 0.65,
                                                window=window)
    table["gsd"] = frontier.Setting("gsd", "gsd", window=window)
    for s in frontier.rule_settings({rule: [{}] for rule in GRID_RULES}, vocab):
        table[s.mode] = frontier.Setting(s.label, s.mode, s.coupling, window=window)
    return table


def _job(model: str, setting: frontier.Setting, init: str, prompts: list) -> dict:
    with_init = frontier.Setting(**{**setting.__dict__, "params": (("draft_init", init),)})
    record = frontier.run_setting(model, with_init, 0, prompts)
    return dict(setting=setting.label, window=setting.window, draft_init=init, **record)


def paired(records: list[dict]) -> list[dict]:
    """One row per record: mean passes ± se, and against the same setting's uniform record the paired difference of
    each image's passes (mean ± se) and the relative change."""
    uniform = {r["setting"]: np.asarray(r["row_passes"]) for r in records if r["draft_init"] == "uniform"}
    rows = []
    for r in records:
        passes = np.asarray(r["row_passes"])
        row = dict(setting=r["setting"], draft_init=r["draft_init"], images=len(passes), passes=passes.mean(),
                   se=passes.std(ddof=1) / np.sqrt(len(passes)),
                   quality={k: v for k, v in r.items() if k not in ("row_passes", "setting", "draft_init", "window")})
        base = uniform.get(r["setting"])
        if base is not None and r["draft_init"] != "uniform" and len(base) == len(passes):
            diff = passes - base
            row.update(diff=diff.mean(), diff_se=diff.std(ddof=1) / np.sqrt(len(diff)), rel=diff.mean() / base.mean())
        rows.append(row)
    return rows


def report(path: str) -> str:
    records = [json.loads(line) for line in open(path)]
    lines = [f"{'setting':34s} {'draft_init':10s} {'passes':>16s} {'paired diff to uniform':>26s}  quality"]
    for row in sorted(paired(records), key=lambda r: (r["setting"], r["draft_init"] != "uniform", r["draft_init"])):
        diff = f"{row['diff']:+8.1f} ± {row['diff_se']:.1f} ({row['rel']:+.1%})" if "diff" in row else ""
        quality = " ".join(f"{k}={v:.3g}" for k, v in row["quality"].items()
                           if k not in ("passes", "passes_se", "batch_passes") and isinstance(v, float))
        lines.append(f"{row['setting']:34s} {row['draft_init']:10s} {row['passes']:8.1f} ± {row['se']:5.1f} "
                     f"{diff:>26s}  {quality}")
    return "\n".join(lines)


def timing(model: str, table: dict, names: list, inits: list, prompts: list) -> list[dict]:
    """CPU and wall seconds per image and passes at B = 1 for every (setting, draft_init), interleaved."""
    import time

    import torch

    from csd_kernels import generate, zoo

    torch.set_num_threads(1)
    entry = zoo.load(model)
    runs = [(name, init) for name in names for init in inits]
    cpu, wall, passes = ({run: [] for run in runs} for _ in range(3))
    for i, prompt in enumerate([prompts[0]] + prompts):
        for name, init in runs:
            begin, begin_cpu = time.perf_counter(), time.process_time()
            out = generate(entry.model, **entry.prompt_inputs([prompt]), seed=i,
                           **{**entry.defaults, **table[name].generate_kwargs(), "draft_init": init})
            if i:  # call 0 warms up
                cpu[name, init].append(time.process_time() - begin_cpu)
                wall[name, init].append(time.perf_counter() - begin)
                passes[name, init].append(out.forward_passes)
    return [dict(setting=table[name].label, draft_init=init, images=len(prompts),
                 cpu_per_image=float(np.mean(cpu[name, init])),
                 cpu_se=float(np.std(cpu[name, init], ddof=1) / np.sqrt(len(prompts))),
                 wall_per_image=float(np.mean(wall[name, init])), passes=float(np.mean(passes[name, init])),
                 cpu_ms_per_pass=1e3 * float(np.sum(cpu[name, init]) / np.sum(passes[name, init])))
            for name, init in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("scenes", "digits"), default="scenes")
    parser.add_argument("--images", type=int, default=96, help="scenes: prompts (default 96)")
    parser.add_argument("--per-class", dest="per_class", type=int, default=8, help="digits: images per class")
    parser.add_argument("--settings", default="sjd+maximal,csd", help="comma-separated names of named_settings()")
    parser.add_argument("--inits", default="uniform,above", help="comma-separated draft_init values")
    parser.add_argument("--window", type=int, default=None, help="default: the model's")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="output stem (OUT.jsonl)")
    parser.add_argument("--report", default=None, help="print the table of this jsonl and stop")
    parser.add_argument("--timing", type=int, default=0, help="CPU seconds per image at B = 1 on N prompts instead")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    table = named_settings(args.window, frontier.model_vocab(args.model))
    unknown = [name for name in args.settings.split(",") if name not in table]
    if unknown:
        parser.error(f"--settings: unknown {unknown}; one of {', '.join(table)}")
    prompts = (measurement_prompts("scenes", images=args.images) if args.model == "scenes"
               else measurement_prompts("digits", per_class=args.per_class))
    if args.timing:
        rows = timing(args.model, table, args.settings.split(","), args.inits.split(","), prompts[:args.timing])
        out = (args.out or f"docs/img/drafts_{args.model}_timing") + ".json"
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
        for row in rows:
            print(f"{row['setting']:34s} {row['draft_init']:10s} {row['passes']:7.1f} passes "
                  f"{row['cpu_per_image']:7.2f} ± {row['cpu_se']:.2f} CPU s/image "
                  f"{row['cpu_ms_per_pass']:6.1f} ms/pass")
        return
    jobs = [(args.model, table[name], init, prompts) for name in args.settings.split(",")
            for init in args.inits.split(",")]
    out = (args.out or f"docs/img/drafts_{args.model}_w{args.window or 'default'}") + ".jsonl"
    with multiprocessing.Pool(args.workers, initializer=frontier._init_worker) as pool, open(out, "a") as f:
        for record in pool.imap_unordered(_star, jobs):
            f.write(json.dumps(record) + "\n")
            f.flush()
            print(record["setting"], record["draft_init"], f"{record['passes']:.1f}", flush=True)
    print(report(out))


def _star(job):
    return _job(*job)


if __name__ == "__main__":
    main()
