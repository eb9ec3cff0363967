"""Sharded, resumable generation and evaluation on torch.distributed: ``csd run``.

    csd run --model digits --prompts prompts.txt --modes ar,sjd,csd --out DIR
    torchrun --nproc-per-node N -m csd_kernels run --model digits --prompts prompts.txt --modes ar,sjd,csd --out DIR

Work items are (mode, prompt index) pairs, listed mode-major: ``[(m, i) for m in modes for i in range(num_prompts)]``.
Item number g goes to rank ``g % world_size``; each rank generates its share in batches of ``batch_size`` rows of one
mode on its own device (``cuda:LOCAL_RANK`` with nccl when CUDA is available, else CPU with gloo). The seed of an image
is :func:`image_seed` (global seed, prompt index, mode), passed to :func:`csd_kernels.generate` as a per-row seed; a
row's tokens do not depend on the other rows of its batch, so neither the rank count nor the batch size changes an
image. A rerun of the same command skips complete images and regenerates missing, truncated or corrupt ones (files:
:mod:`.files`). :func:`run` reads as: check the arguments → take the folder (rank 0) → plan this rank's share →
generate it in batches → gather and summarise (rank 0).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .. import zoo
from ..config.modes import COUPLED_MODES, exact_distortion
from ..decoding import MODES, GenerationConfig, generate
from ..decoding.validation import TREE_MODES, check, check_backend, check_generate, check_tree
from ..fileio.inputs import read_prompt_lines, read_prompts
from ..fileio.outputs import Output, OutputError, write_atomic
from ..fileio.signals import Interrupted
from .files import (
    FORMAT,
    LOCK,
    MANIFEST,
    SETTINGS,
    SUMMARY,
    TABLE,
    RunLock,
    check_manifest,
    clean_temporaries,
    item_complete,
    item_paths,
    json_bytes,
    png_bytes,
)
from .group import Dist, close_logger, cpu_count, rank_logger
from .summary import summarize
from .usage import UsageError, as_flags, check_out, writable_dir

__all__ = ["image_seed", "work_items", "shard", "read_prompts", "parse_modes", "run", "CRASH_ENV", "MANIFEST", "LOCK",
           "SUMMARY", "TABLE"]

# Test hook: "K" (every rank) or "R:K" (rank R only) -> raise after the rank has written K images in this run.
CRASH_ENV = "CSD_RUN_CRASH_AFTER"


# ----------------------------------------------------------------------------------------------------------------------
# deterministic work split and seeds
# ----------------------------------------------------------------------------------------------------------------------
def image_seed(global_seed: int, index: int, mode: str) -> int:
    """The seed of image ``index`` of ``mode``: the first 4 bytes of sha256("csd-run/<seed>/<mode>/<index>"), 31 bits.

    Depends on nothing else (not the rank, the rank count, the batch or the Python process).
    """
    digest = hashlib.sha256(f"csd-run/{int(global_seed)}/{mode}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def work_items(num_prompts: int, modes) -> list[tuple[str, int]]:
    """All (mode, prompt index) items, mode-major."""
    return [(mode, index) for mode in modes for index in range(num_prompts)]


def shard(items: list, rank: int, world_size: int) -> list:
    """Item g goes to rank g % world_size."""
    return items[rank::world_size]


def parse_modes(text) -> list[str]:
    modes = [m.strip() for m in (text.split(",") if isinstance(text, str) else text) if m.strip()]
    if not modes:
        raise UsageError("--modes: give at least one mode, e.g. ar,sjd,csd")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UsageError(f"--modes: unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise UsageError(f"--modes {','.join(modes)}: a mode is listed twice")
    return modes


# ----------------------------------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class RunSpec:
    """What a run is asked to do (the command line of ``csd run``)."""

    model: str
    prompts_file: str
    modes: list
    out: str
    seed: int = 0
    batch_size: int = 16
    coupling: Optional[str] = None
    generate_kwargs: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)  # weights, config, ... (zoo.load keywords)
    tree: Optional[tuple] = None  # (K, D): a draft tree for the run's sjd and csd items (the static loop)


def run(model: str, prompts_file: str, modes, out: str, *, seed: int = 0, batch_size: int = 16,
        coupling: Optional[str] = None, generate_kwargs: Optional[dict] = None, quiet: bool = False,
        num_threads: Optional[int] = None, model_options: Optional[dict] = None,
        tree: Optional[tuple] = None) -> Optional[dict]:
    """Generate every (mode, prompt) image of the run in ``out`` (skipping complete ones); the summary on rank 0.

    Call it in every process of a torchrun job (or in one plain process). Returns the summary dict on rank 0 and
    None on the other ranks. Bad arguments raise :class:`.usage.UsageError` on rank 0 (SystemExit(2) on
    the other ranks, which print nothing).
    """
    begin = time.perf_counter()
    spec = RunSpec(model, prompts_file, modes, out, seed, batch_size, coupling, dict(generate_kwargs or {}),
                   dict(model_options or {}), None if tree is None else tuple(tree))
    ctx = Dist.init()
    threads = torch.get_num_threads()
    lock, log, ok = None, None, False
    existed = os.path.isdir(out)
    try:
        spec.modes = _same_verdict(ctx, lambda: _check_arguments(spec, num_threads, ctx.device))
        _verdict_of_rank0(ctx, lambda: check_out(spec.out))
        _set_threads(ctx, num_threads)
        setup = _take_folder(ctx, spec)
        lock = setup.pop("lock", None)
        log = rank_logger(out, ctx.rank, quiet)
        _log_start(ctx, log, setup, lock)
        entry = zoo.load(spec.model, device=ctx.device, **spec.model_options)  # rank 0: cached by _prepare
        tokens_per_image = int(np.prod(entry.model.grid))
        share = _plan_share(ctx, spec, setup["prompts"], tokens_per_image, log)
        written = _generate_share(ctx, spec, entry, setup["prompts"], setup["manifest"]["generate"], share, log, quiet)
        summary = _finish(ctx, spec, entry, setup, share, written, tokens_per_image, begin, quiet)
        log.info("done: %d images generated in this run", written)
        ok = True
        return summary
    except (OutputError, Interrupted) as exc:  # one line: what happened and what the user still has
        if log is not None:
            log.error("stopped: %s", exc)
        started = os.path.isfile(os.path.join(spec.out, MANIFEST))
        exc.kept = _kept(spec, existed) if started or not exc.kept else exc.kept
        raise
    finally:
        if log is not None:
            close_logger(log)
        # on failure with several ranks, others may still be writing until torchrun stops them: keep the lock
        # (a rerun on this host takes it over once rank 0's process is gone)
        if lock is not None and (ok or ctx.world_size == 1):
            lock.release()
        ctx.close(finished=ok)
        torch.set_num_threads(threads)


def _kept(spec: RunSpec, existed: bool) -> str:
    """What a stopped run leaves: the complete images in the folder (each JSON marks one), and how to go on."""
    if not os.path.isfile(os.path.join(spec.out, MANIFEST)):
        return f"nothing was written to {spec.out}" if not existed else f"{spec.out} holds no images of this run"
    modes = [m for m in os.listdir(spec.out) if m in MODES and os.path.isdir(os.path.join(spec.out, m))]
    done = sum(name.endswith(".json") and not name.startswith(".") for m in modes
               for name in os.listdir(os.path.join(spec.out, m)))
    try:
        total = f" of {len(read_prompts(spec.prompts_file)) * len(modes)}"
    except ValueError:
        total = ""
    return f"{done}{total} images kept in {spec.out}; rerun the same command to resume"


def _same_verdict(ctx: Dist, check):
    """check() on every rank (the same inputs give the same verdict); only rank 0 reports a UsageError."""
    try:
        return check()
    except UsageError:
        if ctx.rank == 0:
            raise
        raise SystemExit(2) from None


def _verdict_of_rank0(ctx: Dist, check):
    """check() on rank 0 alone, its verdict sent to every rank: for what the ranks would see differently (the --out
    folder, which rank 0's probe creates and removes under another rank's check). A UsageError or OutputError there
    stops every rank (SystemExit(2) on the others, which print nothing)."""
    result = failure = None
    if ctx.rank == 0:
        try:
            result = check()
        except (UsageError, OutputError) as exc:  # (a full disk writing run.json: every rank stops)
            failure = exc
    refused = ctx.broadcast(failure is not None)
    if failure is not None:
        raise failure
    if refused:
        raise SystemExit(2)
    return result


def _check_arguments(spec: RunSpec, num_threads: Optional[int], device: torch.device) -> list:
    """Every argument of the run checked by the API's own rules (csd_kernels.decoding.validation), before anything is
    loaded or written; returns the modes. The same on every rank: it reads no file."""
    modes = parse_modes(spec.modes)
    with as_flags():
        check("batch_size", spec.batch_size)
        check("seed", spec.seed)
        check("num_threads", num_threads)
        given = {k: v for k, v in spec.generate_kwargs.items() if v is not None}
        check_backend(given.pop("backend", None), device)
        check_generate("csd", spec.coupling, **given)  # (the coupling applies to the run's sjd and csd items)
        _check_tree(spec, modes, given.get("window"))
    return modes


def _check_tree(spec: RunSpec, modes: list, window: Optional[int]) -> None:
    """--tree applies to the run's items of a mode that takes a tree (modes.TREE_MODES): checked as they run it
    (generate()'s default window unless given)."""
    if spec.tree is None:
        return
    if not set(TREE_MODES) & set(modes):
        raise UsageError(f"--tree {','.join(map(str, spec.tree))}: a draft tree applies to the run's "
                         f"{', '.join(TREE_MODES)} items; --modes {','.join(modes)} has none")
    window = GenerationConfig().window if window is None else window
    check_tree(spec.tree, "sjd", window, spec.coupling, static=True)


def _set_threads(ctx: Dist, num_threads: Optional[int]) -> None:
    if num_threads is not None:
        torch.set_num_threads(max(1, int(num_threads)))
    elif ctx.device.type == "cpu" and ctx.local_world_size > 1:
        torch.set_num_threads(max(1, cpu_count() // ctx.local_world_size))


def _take_folder(ctx: Dist, spec: RunSpec) -> dict:
    """Rank 0 checks prompts, model and settings, locks the folder and writes or matches run.json; every rank gets
    the verdict (prompts, manifest, resuming, cleaned; rank 0 also the lock)."""
    setup = _verdict_of_rank0(ctx, lambda: _prepare(spec, ctx.device))
    lock = setup.pop("lock") if ctx.rank == 0 else None
    return dict(ctx.broadcast(setup), lock=lock)


def _prepare(spec: RunSpec, device: torch.device) -> dict:
    """Rank 0: prompts, model and settings checked, the folder locked, run.json written or matched."""
    RunLock(spec.out).check_free()  # (a folder in use: refused before the model loads)
    try:
        prompts = zoo.check_prompt_file(spec.model, spec.prompts_file)  # (by the grammar: before the model loads)
        entry = zoo.load(spec.model, device=device, **spec.model_options)
        zoo.check_lantern_k(entry, spec.modes, spec.generate_kwargs.get("lantern_k"))
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    for number, prompt in read_prompt_lines(spec.prompts_file):  # (what only the loaded model knows: a class count)
        try:
            entry.prompt_inputs([prompt])
        except ValueError as exc:
            raise UsageError(f"--prompts {spec.prompts_file}: line {number}: {exc}") from exc
    settings = _generate_settings(entry, spec.generate_kwargs)
    with as_flags():  # the model's defaults filled in
        check_generate("csd", spec.coupling, **{k: v for k, v in settings.items() if k != "backend"})
        _check_tree(spec, spec.modes, settings["window"])
    manifest = _manifest(spec, prompts, settings)
    writable_dir(spec.out)
    lock = RunLock(spec.out).acquire()
    try:
        resuming = check_manifest(spec.out, manifest)
        cleaned = clean_temporaries(spec.out, spec.modes)
        for mode in spec.modes:
            os.makedirs(os.path.join(spec.out, mode), exist_ok=True)
    except BaseException:
        lock.release()
        raise
    return {"prompts": prompts, "manifest": manifest, "lock": lock, "resuming": resuming, "cleaned": cleaned}


def _generate_settings(entry, overrides: dict) -> dict:
    """Every generate() setting a run records: generate()'s defaults < the model's defaults < the command line."""
    given = {k: v for k, v in overrides.items() if v is not None and k in SETTINGS}
    return entry.defaults.replace(**given).as_dict(SETTINGS)


def _manifest(spec: RunSpec, prompts: list, settings: dict) -> dict:
    with open(spec.prompts_file, "rb") as f:
        raw = f.read()
    return {
        "format": FORMAT, "model": spec.model, "model_options": zoo.describe_options(spec.model_options),
        "modes": list(spec.modes), "seed": int(spec.seed), "coupling": spec.coupling,
        "tree": None if spec.tree is None else list(spec.tree),
        "prompts_file": os.path.abspath(spec.prompts_file), "num_prompts": len(prompts),
        "prompts_sha256": hashlib.sha256("\n".join(prompts).encode()).hexdigest(),
        "prompts_file_sha256": hashlib.sha256(raw).hexdigest(),
        "generate": settings,
        "seed_rule": "sha256('csd-run/<seed>/<mode>/<index>')[:4] & 0x7FFFFFFF",
        "shard_rule": "item g of [(mode, index) for mode in modes for index in prompts] -> rank g % world_size",
    }


def _log_start(ctx: Dist, log, setup: dict, lock: Optional[RunLock]) -> None:
    log.info("start: world size %d, device %s, %d torch threads, %s", ctx.world_size, ctx.device,
             torch.get_num_threads(), "resuming" if setup["resuming"] else "new run")
    if lock is not None and lock.took_over:
        log.warning("took over a stale lock of a dead process: %s", lock.took_over)
    if ctx.rank == 0 and setup["cleaned"]:
        log.info("removed %d temporary files of a killed run", setup["cleaned"])


@dataclass
class Share:
    """This rank's items: complete records, batches to generate, and counts for the summary."""

    records: list
    batches: list  # [[(mode, index, seed), ...], ...], one mode per batch
    todo: int
    redone: int
    mine: int


def _plan_share(ctx: Dist, spec: RunSpec, prompts: list, tokens_per_image: int, log) -> Share:
    mine = shard(work_items(len(prompts), spec.modes), ctx.rank, ctx.world_size)
    records, todo, redone = [], [], 0
    for mode, index in mine:
        s = image_seed(spec.seed, index, mode)
        record, why = item_complete(spec.out, mode, index, prompts[index], s, tokens_per_image)
        if record is not None:
            records.append(record)
            continue
        todo.append((mode, index, s))
        if why != "missing":
            redone += 1
            log.info("%s/%06d: regenerating (%s)", mode, index, why)
    batches = []
    for item in todo:
        if batches and batches[-1][0][0] == item[0] and len(batches[-1]) < spec.batch_size:
            batches[-1].append(item)
        else:
            batches.append([item])
    log.info("%d items: %d complete, %d to generate (%d of them corrupt or partial), %d batches",
             len(mine), len(records), len(todo), redone, len(batches))
    return Share(records, batches, len(todo), redone, len(mine))


def _generate_share(ctx: Dist, spec: RunSpec, entry, prompts: list, settings: dict, share: Share, log,
                    quiet: bool) -> int:
    """Every rank steps through max(batches over ranks) lockstep steps (one all_gather of the progress per step)."""
    counts = ctx.all_gather((len(share.records), len(share.batches)))
    bar = None
    if ctx.rank == 0 and not quiet:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts) * len(spec.modes), initial=sum(c[0] for c in counts), desc="csd run", unit="img")
    crash_after = _crash_after(ctx.rank)
    written = 0
    try:
        for step in range(max(c[1] for c in counts)):
            if step < len(share.batches):
                for record in _generate_batch(ctx, spec, entry, prompts, settings, share.batches[step], log, step,
                                              len(share.batches)):
                    share.records.append(record)
                    written += 1
                    if crash_after is not None and written >= crash_after:
                        log.error("%s: crashing after %d images (test hook)", CRASH_ENV, written)
                        raise RuntimeError(f"{CRASH_ENV}: rank {ctx.rank} stops after {written} images (test hook)")
            done = ctx.all_gather(len(share.records))
            if bar is not None:
                bar.update(sum(done) - bar.n)
    finally:
        if bar is not None:
            bar.close()
    return written


def _generate_batch(ctx: Dist, spec: RunSpec, entry, prompts: list, settings: dict, batch: list, log, step: int,
                    steps: int):
    """Generate one batch of one mode and write its images; yields each record once its files are on disk."""
    mode = batch[0][0]
    tree = dict(tree=spec.tree, static=True) if spec.tree is not None and mode in TREE_MODES else {}
    t0 = time.perf_counter()
    result = generate(entry.model, **entry.prompt_inputs([prompts[index] for _, index, _ in batch]), mode=mode,
                      seed=[s for _, _, s in batch], coupling=spec.coupling if mode in COUPLED_MODES else None,
                      progress=False, **{**settings, **exact_distortion(mode)}, **tree)  # records state it
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    wall = time.perf_counter() - t0
    per_row = result.passes_per_row()
    images = result.images.cpu().numpy() if result.images is not None else None
    tokens = result.tokens.cpu().tolist()
    distortion = result.distortion_per_row().tolist()
    log.info("step %d/%d: %d %s images in %.2f s, %.1f forward passes per image", step + 1, steps, len(batch), mode,
             wall, float(per_row.mean()))
    for row, (_, index, s) in enumerate(batch):
        record = {
            "format": FORMAT, "mode": mode, "index": index, "prompt": prompts[index], "seed": s,
            "coupling": (spec.coupling or "default") if mode in COUPLED_MODES else None,
            "tree": list(spec.tree) if tree else None,
            "forward_passes": int(per_row[row]), "accepted": [int(a[row]) for a in result.accepted if a[row] > 0],
            "mean_distortion": float(distortion[row]),
            "wall_seconds": wall / len(batch), "batch_wall_seconds": wall, "batch_size": len(batch),
            "rank": ctx.rank, "world_size": ctx.world_size, "device": str(ctx.device),
            "tokens": tokens[row], "png_sha256": None,
        }
        png_path, meta_path = item_paths(spec.out, mode, index)
        if images is not None:  # (a model without a pixel decoder writes the JSON only)
            data = png_bytes(images[row])
            record["png_sha256"] = hashlib.sha256(data).hexdigest()
            write_atomic(png_path, data)  # the PNG first: the JSON (with its checksum) marks completion
        write_atomic(meta_path, json_bytes(record))
        yield record


def _crash_after(rank: int) -> Optional[int]:
    spec = os.environ.get(CRASH_ENV, "").strip()
    if not spec:
        return None
    if ":" in spec:
        target, count = spec.split(":", 1)
        return int(count) if int(target) == rank else None
    return int(spec)


def _finish(ctx: Dist, spec: RunSpec, entry, setup: dict, share: Share, written: int, tokens_per_image: int,
            begin: float, quiet: bool) -> Optional[dict]:
    """Rank 0 gathers the per-rank records and writes summary.json / summary.txt."""
    keep_tokens = entry.quality is not None
    compact = [{k: v for k, v in r.items() if keep_tokens or k != "tokens"} for r in share.records]
    gathered = ctx.gather({"rank": ctx.rank, "records": compact, "generated": written, "redone": share.redone,
                           "skipped": share.mine - share.todo})
    if ctx.rank != 0:
        return None
    summary = summarize(gathered, spec.modes, setup["prompts"], entry, setup["manifest"], tokens_per_image,
                        ctx.world_size, spec.batch_size, time.perf_counter() - begin)
    with Output(spec.out) as output:  # the two together: a failure leaves the earlier summary as it was
        output.write(SUMMARY, json_bytes(summary))
        output.write(TABLE, summary["table"] + "\n")
    if not quiet:
        print(summary["table"])
        print(f"{summary['images']} images in {spec.out} ({summary['generated_this_run']} generated now, "
              f"{summary['skipped_complete']} already complete), {summary['wall_seconds']:.1f} s")
    return summary

