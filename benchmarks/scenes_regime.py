"""The regime of the scenes model, per background kind: how much a token's p depends on its neighbours, how flat p
is, and what lossless sjd makes of it — properties of the world and the model, measured without CSD.

    python benchmarks/scenes_regime.py [--weights DIR] [--scenes 24] [--images 16] [--kinds clouds,waves,...]
                                       [--out docs/img/scenes_regime.json]

1. Context sensitivity (SJD-PAC's probe), teacher-forced on rendered scenes of each kind: at a background token t
   (its patch and the patches j back all background), replace the token j positions back by a draw from p there
   (not the original token) and report TVD(p_t, p'_t) for j = 1, 3, 15 and 24 (the token above).
2. The flatness of p on the same background tokens: entropy (nats) and the share with top-1 probability < 0.05.
3. Lossless sjd with independent drafts, B = 1, on prompts naming the kind: passes per image at W 16 and W 32 (ar
   needs 576), the share of W-16 passes that commit a single token, and TVD(p, q) at the background tokens where a
   draft was tested (the share in (0.1, 0.65), where CSD's gate is open and the strict test is not already certain).

p is the loop's: CFG and top-k at the model's defaults (cfg 2, top-k 200), temperature 1. Every figure comes with its
standard error over scenes or images (``±``). Real image models, for comparison (field notes): probe TVD 0.32 / 0.06 /
0.024 at j = 1 / 3 / 15; top-1 < 0.05 on 50-95 % of tokens; sjd-independent 2.2-2.4x at W 16; ~49 % of passes commit
one token.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scenes_common as common
import torch

from csd_kernels.reference.distributions import target_distribution, total_variation
from csd_kernels.zoo.scenes import world
from csd_kernels.zoo.scenes.model import NULL_TOKEN_ID, NUM_CODES, PROMPT_LEN, load_tokenizer, prompt_tokens
from csd_kernels.zoo.scenes.tokenizer import GRID, PATCH, TOKENS_PER_IMAGE

LAGS = (1, 3, 15, 24)
PROBE_SEED = 2026
GATE = (0.1, 0.65)  # CSD's TVD gate (tau 0.65) above the strict test's near-certain acceptance


def background_tokens(scene: world.Scene) -> np.ndarray:
    """bool [576]: tokens whose 4x4 patch holds no pixel of any object."""
    covered = np.zeros((world.CANVAS, world.CANVAS), bool)
    for o in scene.objects:
        row, col = divmod(o.cell, 3)
        covered |= world.shape_mask(o.shape, o.size * world.CELL, (row + 0.5) * world.CELL, (col + 0.5) * world.CELL)
    return ~covered.reshape(GRID[0], PATCH, GRID[1], PATCH).any((1, 3)).reshape(-1)


def loop_probs(lm, prompts: torch.Tensor, codes: torch.Tensor, cfg: float, top_k: int) -> torch.Tensor:
    """p at every image position of teacher-forced sequences, as the decoding loop computes it.
    Shape: prompts [N, 10], codes [N, T] -> [N, T, V] (p of code t given the prompt and codes before t)."""
    seq = torch.cat([prompts, codes[:, :-1]], 1)
    uncond = torch.cat([torch.full_like(prompts, NULL_TOKEN_ID), codes[:, :-1]], 1)
    logits = lm(input_ids=torch.cat([seq, uncond], 0), use_cache=False).logits[:, PROMPT_LEN - 1:, :NUM_CODES]
    cond, unc = logits.float().chunk(2)
    return target_distribution(cond, unc, cfg, 1.0, top_k, torch.float32).p


def probe_scene(lm, scene: world.Scene, tokens: torch.Tensor, gen: torch.Generator, positions: int, cfg: float,
                top_k: int) -> dict:
    """The context probe and the flatness of p on one rendered scene (see the module docstring)."""
    prompt = torch.tensor([prompt_tokens(scene.prompt())])
    p = loop_probs(lm, prompt, tokens[None], cfg, top_k)[0]  # [576, V]
    bg = background_tokens(scene)
    flat = {"entropy": [], "top1": []}
    for t in np.nonzero(bg)[0]:
        pt = p[t]
        flat["entropy"].append(float(-(pt[pt > 0] * pt[pt > 0].log()).sum()))
        flat["top1"].append(float(pt.max()))
    eligible = [t for t in range(max(LAGS), TOKENS_PER_IMAGE) if bg[t] and all(bg[t - j] for j in LAGS)]
    chosen = torch.randperm(len(eligible), generator=gen)[:positions].tolist()
    rows, targets, lags = [], [], []
    for i in chosen:
        t = eligible[i]
        for j in LAGS:
            w = p[t - j].clone()
            w[tokens[t - j]] = 0
            if float(w.sum()) <= 0:
                continue  # p is a point mass on the original: no other token to put there
            changed = tokens[: t + 1].clone()
            changed[t - j] = torch.multinomial(w, 1, generator=gen)[0]
            rows.append(changed)
            targets.append(t)
            lags.append(j)
    tvd = {j: [] for j in LAGS}
    for start in range(0, len(rows), 32):
        chunk = rows[start:start + 32]
        width = max(r.shape[0] for r in chunk)
        batch = torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[0])) for r in chunk])
        p2 = loop_probs(lm, prompt.expand(len(chunk), -1), batch, cfg, top_k)
        for k, row in enumerate(chunk):
            t = targets[start + k]
            tvd[lags[start + k]].append(float(total_variation(p[t], p2[k, t])))
    return {"tvd": tvd, **flat}


def probe(entry, tokenizer, kind: str, scenes: int, positions: int) -> dict:
    """Context sensitivity and flatness over ``scenes`` rendered scenes of one background kind (seeded)."""
    rng = np.random.default_rng([PROBE_SEED, world.BACKGROUNDS.index(kind)])
    gen = torch.Generator().manual_seed(PROBE_SEED)
    cfg, top_k = entry.defaults.cfg_scale, entry.defaults.top_k
    per_scene = []
    for _ in range(scenes):
        scene = world.sample_scene(rng, background=kind)
        tokens = tokenizer.encode(world.render(scene)[None])[0]
        per_scene.append(probe_scene(entry.model.lm, scene, tokens, gen, positions, cfg, top_k))
    out = {f"tvd_j{j}": mean_se([np.mean(s["tvd"][j]) for s in per_scene if s["tvd"][j]]) for j in LAGS}
    out["entropy"] = mean_se([np.mean(s["entropy"]) for s in per_scene])
    out["top1_below_0.05"] = mean_se([np.mean(np.array(s["top1"]) < 0.05) for s in per_scene])
    out["background_tokens"] = int(sum(len(s["entropy"]) for s in per_scene))
    return out


def sjd_runs(entry, kind: str, images: int, windows=(16, 32)) -> dict:
    """Lossless sjd, independent drafts, B = 1, on ``images`` prompts naming ``kind`` (seeds 0..images-1)."""
    from csd_kernels.zoo.scenes import checker

    prompts = world.random_prompts(images, seed=PROBE_SEED, backgrounds=(kind,))
    out = {}
    for window in windows:
        passes, single, in_gate, tvds = [], [], [], []
        for i, prompt in enumerate(prompts):
            res, _, _ = common.timed(entry, [prompt], seed=i, mode="sjd", coupling="independent", window=window)
            passes.append(res.forward_passes)
            committed = np.asarray(res.accepted)[:, 0]
            single.append(float(np.mean(committed[committed > 0] == 1)))
            image = entry.model.decode(res.tokens)[0].numpy()
            bg = ~checker.object_mask(image).reshape(GRID[0], PATCH, GRID[1], PATCH).any((1, 3))
            tvd = res.tvd_map[0].float().numpy()[bg]
            tvd = tvd[np.isfinite(tvd)]
            tvds.append(tvd)
            in_gate.append(float(np.mean((tvd > GATE[0]) & (tvd < GATE[1]))) if tvd.size else float("nan"))
        row = {"passes": mean_se(passes), "speedup_vs_ar": round(TOKENS_PER_IMAGE / float(np.mean(passes)), 3),
               "single_token_passes": mean_se(single)}
        if window == windows[0]:
            allt = np.concatenate(tvds)
            row["tvd_in_gate"] = mean_se(in_gate)
            row["tvd_quantiles"] = {q: round(float(np.quantile(allt, q)), 3) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}
        out[f"W{window}"] = row
    out["W32_over_W16"] = round(out["W16"]["passes"]["mean"] / out["W32"]["passes"]["mean"], 3)
    return out


def mean_se(values) -> dict:
    a = np.asarray(values, np.float64)
    if a.size == 0:  # e.g. the probe on flat backgrounds: p is a point mass, no other token to put in
        return {"mean": float("nan"), "se": float("nan"), "n": 0}
    se = float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")
    return {"mean": round(float(a.mean()), 4), "se": round(se, 4), "n": int(a.size)}


def fmt(stat: dict, digits: int = 3) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['se']:.{digits}f}"


def table(report: dict) -> str:
    head = ("| kind | TVD j=1 | j=3 | j=15 | j=24 | H (nats) | top-1 < 0.05 | sjd passes W16 | x vs ar | "
            "single-token passes | W32 / W16 | TVD(p,q) in (0.1, 0.65) |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for kind, r in report["kinds"].items():
        pr, sj = r["probe"], r.get("sjd")
        cells = [kind, *(fmt(pr[f"tvd_j{j}"]) for j in LAGS), fmt(pr["entropy"], 2), fmt(pr["top1_below_0.05"], 2)]
        if sj:
            cells += [fmt(sj["W16"]["passes"], 1), f"{sj['W16']['speedup_vs_ar']:.2f}",
                      fmt(sj["W16"]["single_token_passes"], 2), f"{sj['W32_over_W16']:.2f}",
                      fmt(sj["W16"]["tvd_in_gate"], 2)]
        else:
            cells += ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(ap, images=16, out="docs/img/scenes_regime.json")
    ap.add_argument("--scenes", type=int, default=24, help="rendered scenes per kind for the probe (default: 24)")
    ap.add_argument("--positions", type=int, default=8, help="probed tokens per scene (default: 8)")
    ap.add_argument("--kinds", default=",".join(world.BACKGROUNDS),
                    help=f"background kinds (default: all: {','.join(world.BACKGROUNDS)})")
    ap.add_argument("--no-sjd", action="store_true", help="the teacher-forced probe only")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in world.BACKGROUNDS:
            ap.error(f"--kinds: {k!r} is not one of {', '.join(world.BACKGROUNDS)}")
    entry = common.load(args)
    tokenizer = load_tokenizer(args.weights)
    report = {"machine": common.machine(args), "settings": vars(args), "kinds": {}}
    begin = time.process_time()
    with torch.no_grad():
        for kind in kinds:
            row = {"probe": probe(entry, tokenizer, kind, args.scenes, args.positions)}
            if not args.no_sjd:
                row["sjd"] = sjd_runs(entry, kind, args.images)
            report["kinds"][kind] = row
            print(f"{kind}: done ({time.process_time() - begin:.0f} CPU s)", flush=True)
    report["cpu_seconds"] = round(time.process_time() - begin, 1)
    print(table(report))
    common.write(report, args.out)


if __name__ == "__main__":
    main()
