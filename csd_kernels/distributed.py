"""Sharded, resumable generation and evaluation on torch.distributed: ``csd run``.

    csd run --model digits --prompts prompts.txt --modes ar,sjd,csd --out DIR
    torchrun --nproc-per-node N -m csd_kernels run --model digits --prompts prompts.txt --modes ar,sjd,csd --out DIR

Work items are (mode, prompt index) pairs, listed mode-major: ``[(m, i) for m in modes for i in range(num_prompts)]``.
Item number g goes to rank ``g % world_size``; each rank generates its share in batches of ``--batch-size`` rows
of one mode on its own device (``cuda:LOCAL_RANK`` with nccl when CUDA is available, else CPU with gloo). The seed of
an image is :func:`image_seed` (global seed, prompt index, mode), passed to :func:`csd_kernels.generate` as a per-row
seed; a row's tokens do not depend on the other rows of its batch, so neither the rank count nor the batch size
changes an image.

Files (see :data:`MANIFEST`, :data:`LOCK`, ...)::

    DIR/run.json                   the arguments that determine the images (a rerun must match them)
    DIR/.lock                      held by rank 0 while a run is in progress (pid, host)
    DIR/<mode>/<index:06d>.png     the image
    DIR/<mode>/<index:06d>.json    prompt, seed, mode, forward passes, accepted per pass, mean distortion, wall time,
                                   tokens and the sha256 of the PNG bytes
    DIR/logs/rank<r>.log           one log per rank (appended to by every run)
    DIR/summary.json, DIR/summary.txt   written by rank 0 at the end

Every file is written to a temporary name in the same folder and renamed (``os.replace``), so a killed run never
leaves a half-written file under a final name; the PNG is written before its JSON, and an image is complete when
its JSON parses, belongs to this run (mode, index, prompt, seed, token count) and holds the sha256 of the PNG bytes
on disk. A rerun of the same command skips complete images and regenerates missing, truncated or corrupt ones.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import io
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .cli import UsageError, add_generation_options, passes_per_row
from .decoding import COUPLINGS, DRAFT_INITS, MODES, generate

__all__ = ["image_seed", "work_items", "shard", "read_prompts", "item_complete", "RunLock", "run", "format_table",
           "add_run_arguments", "cmd_run", "MANIFEST", "LOCK", "SUMMARY", "TABLE", "CRASH_ENV"]

MANIFEST = "run.json"
LOCK = ".lock"
SUMMARY = "summary.json"
TABLE = "summary.txt"
LOG_DIR = "logs"
FORMAT = 1
# Test hook: "K" (every rank) or "R:K" (rank R only) -> raise after the rank has written K images in this run.
CRASH_ENV = "CSD_RUN_CRASH_AFTER"
_TMP_SUFFIX = ".tmp"
# generate() keywords a run records in run.json (with the model's defaults filled in), and their flags
_SETTINGS = {"window": "--window", "cfg_scale": "--cfg-scale", "temperature": "--temperature", "top_k": "--top-k",
             "entropy_coef": "--entropy-coef", "tvd_threshold": "--tvd-threshold", "draft_init": "--draft-init",
             "backend": "--backend"}
_RECORD_KEYS = ("mode", "index", "prompt", "seed", "forward_passes", "accepted", "mean_distortion", "wall_seconds",
                "tokens", "png_sha256")


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


def read_prompts(path: str) -> list[str]:
    """One prompt per non-blank line (surrounding whitespace stripped); prompt index = position among those lines."""
    if not os.path.isfile(path):
        raise UsageError(f"--prompts {path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.strip() for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompts {path}: cannot read the file ({exc})") from exc
    if not prompts:
        raise UsageError(f"--prompts {path}: the file has no prompts (one per line expected)")
    return prompts


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in str(text).split(",") if m.strip()]
    if not modes:
        raise UsageError("--modes: give at least one mode, e.g. ar,sjd,csd")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UsageError(f"--modes: unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise UsageError(f"--modes {text}: a mode is listed twice")
    return modes


# ----------------------------------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------------------------------
def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``path``, fsync it, then rename it over ``path``."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}{_TMP_SUFFIX}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def png_bytes(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return buffer.getvalue()


def item_paths(out_dir: str, mode: str, index: int) -> tuple[str, str]:
    stem = os.path.join(out_dir, mode, f"{index:06d}")
    return stem + ".png", stem + ".json"


def item_complete(out_dir: str, mode: str, index: int, prompt: str, seed: int,
                  tokens_per_image: Optional[int] = None) -> tuple[Optional[dict], str]:
    """(record, "") when the image is complete and belongs to this run, else (None, why not)."""
    png, meta = item_paths(out_dir, mode, index)
    if not os.path.exists(meta):
        return None, "missing" if not os.path.exists(png) else "no JSON"
    try:
        with open(meta, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError) as exc:
        return None, f"unreadable JSON ({type(exc).__name__})"
    if not isinstance(record, dict) or any(key not in record for key in _RECORD_KEYS):
        return None, "JSON lacks fields"
    expected = {"mode": mode, "index": index, "prompt": prompt, "seed": seed}
    wrong = [key for key, value in expected.items() if record[key] != value]
    if wrong:
        return None, f"JSON of another run ({', '.join(wrong)} differ)"
    tokens = record["tokens"]
    if tokens_per_image is not None and (not isinstance(tokens, list) or len(tokens) != tokens_per_image):
        return None, "wrong token count"
    if record["png_sha256"] is None:  # a model without a pixel decoder: no PNG
        return record, ""
    try:
        with open(png, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None, "PNG missing"
    if digest != record["png_sha256"]:
        return None, "PNG checksum mismatch"
    return record, ""


class RunLock:
    """``DIR/.lock``: created with O_CREAT|O_EXCL by rank 0, holding {"pid", "host", "started"}.

    A lock whose process is gone (same host, pid not running) is stale and is taken over; a lock of a live process,
    or of another host, means the folder is in use: :class:`UsageError`.
    """

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, LOCK)
        self.held = False
        self.took_over: Optional[dict] = None

    def acquire(self) -> "RunLock":
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and self._stale(owner):
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
                    self.took_over = owner
                    continue
                who = (f"pid {owner.get('pid')} on {owner.get('host')}, since {owner.get('started')}" if owner
                       else "unreadable lock file")
                raise UsageError(f"--out {os.path.dirname(self.path)}: the folder is in use by another run ({who}); "
                                 f"wait for it, or remove {self.path} if that run is dead") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise UsageError(f"--out {os.path.dirname(self.path)}: could not take the lock {self.path}")

    def _owner(self) -> Optional[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                owner = json.load(f)
            return owner if isinstance(owner, dict) else None
        except (OSError, ValueError):
            return None

    @staticmethod
    def _stale(owner: dict) -> bool:
        if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
            return False
        try:
            os.kill(owner["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def release(self) -> None:
        if self.held:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.held = False


def _check_manifest(out_dir: str, manifest: dict) -> bool:
    """Write run.json, or compare it with the existing one. True when resuming."""
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        atomic_write(path, _json_bytes(manifest))
        return False
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--out {out_dir}: {MANIFEST} is unreadable ({exc}); use a new --out folder") from exc
    diffs = []
    for key, flag in [("format", "format"), ("model", "--model"), ("modes", "--modes"), ("seed", "--seed"),
                      ("coupling", "--coupling")]:
        if old.get(key) != manifest[key]:
            shown = lambda v: ",".join(v) if isinstance(v, list) else v  # noqa: E731
            diffs.append(f"{flag} {shown(manifest[key])} (the run has {shown(old.get(key))})")
    if (old.get("num_prompts"), old.get("prompts_sha256")) != (manifest["num_prompts"], manifest["prompts_sha256"]):
        diffs.append(f"--prompts {manifest['prompts_file']} ({manifest['num_prompts']} prompts, other contents than "
                     f"the run's {old.get('prompts_file')}: {old.get('num_prompts')} prompts)")
    old_settings = old.get("generate") or {}
    for key, flag in _SETTINGS.items():
        if old_settings.get(key) != manifest["generate"][key]:
            diffs.append(f"{flag} {manifest['generate'][key]} (the run has {old_settings.get(key)})")
    if diffs:
        raise UsageError(f"--out {out_dir} holds a run with other arguments: {'; '.join(diffs)}. Rerun with the "
                         f"run's arguments (see {path}) or use a new --out folder")
    return True


def _clean_temporaries(out_dir: str, modes) -> int:
    """Remove temporary files a killed run left behind (only called while holding the lock)."""
    removed = 0
    for folder in [out_dir] + [os.path.join(out_dir, m) for m in modes]:
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name.startswith(".") and name.endswith(_TMP_SUFFIX):
                try:
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


# ----------------------------------------------------------------------------------------------------------------------
# torch.distributed
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    active: bool = False  # a process group is in use
    owned: bool = False  # we created it (and destroy it)

    @classmethod
    def init(cls) -> "Dist":
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        if dist.is_available() and dist.is_initialized():  # a caller's process group
            local = int(os.environ.get("LOCAL_RANK", 0))
            device = torch.device("cuda", local) if cuda else torch.device("cpu")
            return cls(dist.get_rank(), dist.get_world_size(), local,
                       int(os.environ.get("LOCAL_WORLD_SIZE", 1)), device, True, False)
        if "WORLD_SIZE" in os.environ and "RANK" in os.environ:  # torchrun
            local = int(os.environ.get("LOCAL_RANK", 0))
            if cuda:
                torch.cuda.set_device(local)
            dist.init_process_group(backend="nccl" if cuda else "gloo")
            device = torch.device("cuda", local) if cuda else torch.device("cpu")
            return cls(dist.get_rank(), dist.get_world_size(), local,
                       int(os.environ.get("LOCAL_WORLD_SIZE", 1)), device, True, True)
        return cls(device=torch.device("cuda", 0) if cuda else torch.device("cpu"))

    def broadcast(self, obj):
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj) -> list:
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather(self, obj) -> Optional[list]:
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def close(self) -> None:
        if self.owned:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.owned = self.active = False


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _crash_after(rank: int) -> Optional[int]:
    spec = os.environ.get(CRASH_ENV, "").strip()
    if not spec:
        return None
    if ":" in spec:
        target, count = spec.split(":", 1)
        return int(count) if int(target) == rank else None
    return int(spec)


def _logger(out_dir: str, rank: int, quiet: bool) -> logging.Logger:
    os.makedirs(os.path.join(out_dir, LOG_DIR), exist_ok=True)
    log = logging.getLogger(f"csd_kernels.run.{os.getpid()}.rank{rank}")
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
    handler = logging.FileHandler(os.path.join(out_dir, LOG_DIR, f"rank{rank}.log"))
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} pid {os.getpid()} %(levelname)s %(message)s"))
    log.addHandler(handler)
    return log


def _close_logger(log: logging.Logger) -> None:
    for handler in list(log.handlers):
        handler.close()
        log.removeHandler(handler)


def _generate_settings(entry, overrides: dict) -> dict:
    """Every generate() setting a run records: generate()'s defaults < the model's defaults < the command line."""
    params = inspect.signature(generate).parameters
    settings = {key: params[key].default for key in _SETTINGS}
    settings.update({k: v for k, v in entry.defaults.items() if k in settings})
    settings.update({k: v for k, v in overrides.items() if v is not None and k in settings})
    return settings


def _move_model(model, device: torch.device) -> None:
    if device.type == "cpu":
        return
    for name in ("lm", "model", "backbone"):
        module = getattr(model, name, None)
        if isinstance(module, torch.nn.Module):
            module.to(device)
            return
    if isinstance(model, torch.nn.Module):
        model.to(device)


# ----------------------------------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------------------------------
def run(model: str, prompts_file: str, modes, out: str, *, seed: int = 0, batch_size: int = 16,
        coupling: Optional[str] = None, generate_kwargs: Optional[dict] = None, quiet: bool = False,
        num_threads: Optional[int] = None) -> Optional[dict]:
    """Generate every (mode, prompt) image of the run in ``out`` (skipping complete ones); the summary on rank 0.

    Call it in every process of a torchrun job (or in one plain process). Returns the summary dict on rank 0 and
    None on the other ranks. Bad arguments raise :class:`csd_kernels.cli.UsageError` on rank 0 (SystemExit(2) on
    the other ranks, which print nothing).
    """
    begin = time.perf_counter()
    ctx = Dist.init()
    threads = torch.get_num_threads()
    lock: Optional[RunLock] = None
    log: Optional[logging.Logger] = None
    ok = False
    try:
        try:  # the same verdict on every rank, no exchange needed; only rank 0 reports it
            modes = parse_modes(modes) if isinstance(modes, str) else parse_modes(",".join(modes))
            if batch_size < 1:
                raise UsageError(f"--batch-size {batch_size}: must be >= 1")
            if coupling is not None and coupling not in COUPLINGS:
                raise UsageError(f"--coupling {coupling}: choose from {', '.join(sorted(COUPLINGS))}")
        except UsageError:
            if ctx.rank == 0:
                raise
            raise SystemExit(2) from None
        if num_threads is not None:
            torch.set_num_threads(max(1, int(num_threads)))
        elif ctx.device.type == "cpu" and ctx.local_world_size > 1:
            torch.set_num_threads(max(1, _cpu_count() // ctx.local_world_size))

        # ---- rank 0 checks the arguments and takes the folder; the verdict goes to every rank ----------------------
        setup = None
        if ctx.rank == 0:
            try:
                setup = {"error": None, **_prepare(model, prompts_file, modes, out, seed, coupling, generate_kwargs)}
                lock = setup.pop("lock")
            except UsageError as exc:
                setup = {"error": str(exc)}
        setup = ctx.broadcast(setup)
        if setup["error"] is not None:
            if ctx.rank == 0:
                raise UsageError(setup["error"])
            raise SystemExit(2)
        prompts, manifest = setup["prompts"], setup["manifest"]

        log = _logger(out, ctx.rank, quiet)
        log.info("start: world size %d, device %s, %d torch threads, %s", ctx.world_size, ctx.device,
                 torch.get_num_threads(), "resuming" if setup["resuming"] else "new run")
        if ctx.rank == 0 and lock.took_over:
            log.warning("took over a stale lock of a dead process: %s", lock.took_over)
        if ctx.rank == 0 and setup["cleaned"]:
            log.info("removed %d temporary files of a killed run", setup["cleaned"])

        from . import zoo

        entry = zoo.load(model)
        _move_model(entry.model, ctx.device)
        settings = manifest["generate"]
        tokens_per_image = int(np.prod(_grid(entry.model)))

        # ---- this rank's share: what is complete, what is to do ----------------------------------------------------
        mine = shard(work_items(len(prompts), modes), ctx.rank, ctx.world_size)
        records, todo, redo = [], [], 0
        for mode, index in mine:
            s = image_seed(seed, index, mode)
            record, why = item_complete(out, mode, index, prompts[index], s, tokens_per_image)
            if record is not None:
                records.append(record)
            else:
                todo.append((mode, index, s))
                if why != "missing":
                    redo += 1
                    log.info("%s/%06d: regenerating (%s)", mode, index, why)
        batches = []
        for mode, index, s in todo:
            if batches and batches[-1][0][0] == mode and len(batches[-1]) < batch_size:
                batches[-1].append((mode, index, s))
            else:
                batches.append([(mode, index, s)])
        log.info("%d items: %d complete, %d to generate (%d of them corrupt or partial), %d batches",
                 len(mine), len(records), len(todo), redo, len(batches))
        counts = ctx.all_gather((len(records), len(batches)))
        total = len(prompts) * len(modes)
        steps = max(c[1] for c in counts)
        bar = None
        if ctx.rank == 0 and not quiet:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, initial=sum(c[0] for c in counts), desc="csd run", unit="img")

        # ---- generate, in lockstep batches (one all_gather of the progress per step) -------------------------------
        crash_after = _crash_after(ctx.rank)
        written = 0
        for step in range(steps):
            if step < len(batches):
                batch = batches[step]
                mode = batch[0][0]
                rows = [prompts[index] for _, index, _ in batch]
                input_ids = entry.prompt_ids(rows)
                t0 = time.perf_counter()
                result = generate(entry.model, input_ids, mode=mode, seed=[s for _, _, s in batch],
                                  coupling=coupling if mode in ("sjd", "csd") else None, progress=False, **settings)
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize(ctx.device)
                wall = time.perf_counter() - t0
                per_row = passes_per_row(result)
                images = result.images.cpu().numpy() if result.images is not None else None
                tokens = result.tokens.cpu().tolist()
                distortion = torch.nan_to_num(result.distortion_map, nan=0.0).float().mean((1, 2)).cpu().tolist()
                for row, (_, index, s) in enumerate(batch):
                    record = {
                        "format": FORMAT, "mode": mode, "index": index, "prompt": prompts[index], "seed": s,
                        "coupling": (coupling or "default") if mode in ("sjd", "csd") else None,
                        "forward_passes": int(per_row[row]),
                        "accepted": [int(a[row]) for a in result.accepted if a[row] > 0],
                        "mean_distortion": float(distortion[row]),
                        "wall_seconds": wall / len(batch), "batch_wall_seconds": wall, "batch_size": len(batch),
                        "rank": ctx.rank, "world_size": ctx.world_size, "device": str(ctx.device),
                        "tokens": tokens[row], "png_sha256": None,
                    }
                    png_path, meta_path = item_paths(out, mode, index)
                    if images is not None:  # (a model without a pixel decoder writes the JSON only)
                        data = png_bytes(images[row])
                        record["png_sha256"] = hashlib.sha256(data).hexdigest()
                        atomic_write(png_path, data)  # the PNG first: the JSON (with its checksum) marks completion
                    atomic_write(meta_path, _json_bytes(record))
                    records.append(record)
                    written += 1
                    if crash_after is not None and written >= crash_after:
                        log.error("%s: crashing after %d images (test hook)", CRASH_ENV, written)
                        raise RuntimeError(f"{CRASH_ENV}: rank {ctx.rank} stops after {written} images (test hook)")
                log.info("step %d/%d: %d %s images in %.2f s, %.1f forward passes per image", step + 1, len(batches),
                         len(batch), mode, wall, float(per_row.mean()))
            done = ctx.all_gather(len(records))
            if bar is not None:
                bar.update(sum(done) - bar.n)
        if bar is not None:
            bar.close()

        # ---- rank 0 gathers the per-rank records and writes the summary ------------------------------------------
        keep_tokens = entry.quality is not None
        compact = [{k: v for k, v in r.items() if keep_tokens or k != "tokens"} for r in records]
        gathered = ctx.gather({"rank": ctx.rank, "records": compact, "generated": written, "redone": redo,
                               "skipped": len(mine) - len(todo)})
        summary = None
        if ctx.rank == 0:
            summary = _summarize(gathered, modes, prompts, entry, manifest, tokens_per_image, ctx.world_size,
                                 batch_size, time.perf_counter() - begin)
            atomic_write(os.path.join(out, SUMMARY), _json_bytes(summary))
            atomic_write(os.path.join(out, TABLE), (summary["table"] + "\n").encode())
            if not quiet:
                print(summary["table"])
                print(f"{summary['images']} images in {out} ({summary['generated_this_run']} generated now, "
                      f"{summary['skipped_complete']} already complete), {summary['wall_seconds']:.1f} s")
        log.info("done: %d images generated in this run", written)
        ok = True
        return summary
    finally:
        if log is not None:
            _close_logger(log)
        # on failure with several ranks, others may still be writing until torchrun stops them: keep the lock
        # (a rerun on this host takes it over once rank 0's process is gone)
        if lock is not None and (ok or ctx.world_size == 1):
            lock.release()
        ctx.close()
        torch.set_num_threads(threads)


def _grid(model) -> tuple[int, int]:
    from .models import get_adapter

    return tuple(get_adapter(model).grid)


def _prepare(model, prompts_file, modes, out, seed, coupling, generate_kwargs) -> dict:
    """Rank 0: prompts, model and settings checked, the folder locked, run.json written or matched."""
    from . import zoo
    from .cli import _writable_dir

    if model not in zoo.MODEL_NAMES:
        raise UsageError(f"--model {model!r}: unknown model; choose from {', '.join(zoo.MODEL_NAMES)}")
    prompts = read_prompts(prompts_file)
    entry = zoo.load(model)
    try:
        entry.prompt_ids(prompts)
    except ValueError:
        for line, prompt in enumerate(prompts):
            try:
                entry.prompt_ids([prompt])
            except ValueError as exc:
                raise UsageError(f"--prompts {prompts_file}: prompt {line} ({prompt!r}): {exc}") from exc
        raise
    settings = _generate_settings(entry, generate_kwargs or {})
    if settings["draft_init"] not in DRAFT_INITS:
        raise UsageError(f"--draft-init {settings['draft_init']}: choose from {', '.join(DRAFT_INITS)}")
    with open(prompts_file, "rb") as f:
        raw = f.read()
    manifest = {
        "format": FORMAT, "model": model, "modes": list(modes), "seed": int(seed), "coupling": coupling,
        "prompts_file": os.path.abspath(prompts_file), "num_prompts": len(prompts),
        "prompts_sha256": hashlib.sha256("\n".join(prompts).encode()).hexdigest(),
        "prompts_file_sha256": hashlib.sha256(raw).hexdigest(),
        "generate": settings,
        "seed_rule": "sha256('csd-run/<seed>/<mode>/<index>')[:4] & 0x7FFFFFFF",
        "shard_rule": "item g of [(mode, index) for mode in modes for index in prompts] -> rank g % world_size",
    }
    _writable_dir(out)
    lock = RunLock(out).acquire()
    try:
        resuming = _check_manifest(out, manifest)
        cleaned = _clean_temporaries(out, modes)
        for mode in modes:
            os.makedirs(os.path.join(out, mode), exist_ok=True)
    except BaseException:
        lock.release()
        raise
    return {"prompts": prompts, "manifest": manifest, "lock": lock, "resuming": resuming, "cleaned": cleaned}


def _spread(values) -> dict:
    values = np.asarray(values, dtype=np.float64)
    return {"mean": float(values.mean()), "std": float(values.std()), "min": float(values.min()),
            "max": float(values.max())}


def _summarize(gathered, modes, prompts, entry, manifest, tokens_per_image, world_size, batch_size, wall) -> dict:
    records = [r for part in gathered for r in part["records"]]
    by_mode = {mode: sorted((r for r in records if r["mode"] == mode), key=lambda r: r["index"]) for mode in modes}
    per_mode = {}
    for mode, rows in by_mode.items():
        if not rows:
            continue
        stats = {"images": len(rows),
                 "forward_passes_per_image": _spread([r["forward_passes"] for r in rows]),
                 "wall_seconds": float(sum(r["wall_seconds"] for r in rows)),
                 "wall_seconds_per_image": float(np.mean([r["wall_seconds"] for r in rows])),
                 "mean_distortion": float(np.mean([r["mean_distortion"] for r in rows]))}
        if entry.quality is not None:
            tokens = torch.tensor([r["tokens"] for r in rows], dtype=torch.int64)
            try:
                stats.update({k: float(v) for k, v in entry.quality(tokens, [r["prompt"] for r in rows]).items()})
            except ValueError as exc:  # e.g. the Fréchet distance of a single image
                stats["quality_error"] = str(exc)
        per_mode[mode] = stats
    # speed-up vs ar: the measured ar passes when ar ran, else AR's exact count (one pass per token)
    ar_passes = per_mode["ar"]["forward_passes_per_image"]["mean"] if "ar" in per_mode else float(tokens_per_image)
    for stats in per_mode.values():
        stats["speedup_vs_ar"] = ar_passes / stats["forward_passes_per_image"]["mean"]
    summary = {
        "model": manifest["model"], "modes": list(modes), "num_prompts": len(prompts), "seed": manifest["seed"],
        "generate": manifest["generate"], "coupling": manifest["coupling"],
        "world_size": world_size, "batch_size": batch_size, "tokens_per_image": tokens_per_image,
        "images": len(records), "expected_images": len(prompts) * len(modes),
        "generated_this_run": sum(p["generated"] for p in gathered),
        "skipped_complete": sum(p["skipped"] for p in gathered),
        "redone_corrupt_or_partial": sum(p["redone"] for p in gathered),
        "wall_seconds": wall, "per_mode": per_mode,
        "per_rank": [{"rank": p["rank"], "images": len(p["records"]), "generated": p["generated"]} for p in gathered],
    }
    summary["table"] = format_table(summary)
    return summary


def format_table(summary: dict) -> str:
    per_mode = summary["per_mode"]
    quality = any("accuracy" in s for s in per_mode.values())
    header = (f"{'mode':6} {'images':>7} {'passes/img':>16} {'speed-up':>9} {'wall s':>9} {'s/img':>8} "
              f"{'distortion':>10}")
    if quality:
        header += f" {'accuracy':>9} {'Fréchet':>9}"
    lines = [header, "-" * len(header)]
    for mode, s in per_mode.items():
        passes = s["forward_passes_per_image"]
        line = (f"{mode:6} {s['images']:7d} {passes['mean']:9.1f}±{passes['std']:<6.1f} {s['speedup_vs_ar']:8.2f}x "
                f"{s['wall_seconds']:9.2f} {s['wall_seconds_per_image']:8.3f} {s['mean_distortion']:10.4f}")
        if quality:
            line += f" {s.get('accuracy', float('nan')):9.3f} {s.get('frechet', float('nan')):9.2f}"
        lines.append(line)
    lines.append(f"({summary['world_size']} process(es); wall s = generation seconds summed over ranks; speed-up = "
                 f"ar passes / passes per image)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------------
# command line (``csd run``)
# ----------------------------------------------------------------------------------------------------------------------
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="digits", help="a zoo model (default: digits)")
    parser.add_argument("--prompts", required=True, help="prompts file: one prompt per line (digits: a class id 0..9)")
    parser.add_argument("--modes", default="ar,sjd,csd", help="comma-separated modes (default ar,sjd,csd)")
    parser.add_argument("--out", required=True, help="output folder (rerun the same command to resume)")
    parser.add_argument("--seed", type=int, default=0, help="global seed (default 0)")
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=16,
                        help="images per generate() call on each rank (default 16; does not change the images)")
    parser.add_argument("--coupling", choices=sorted(COUPLINGS),
                        help="next drafts of sjd/csd (default: the lossless-tested choice)")
    add_generation_options(parser)
    parser.add_argument("--num-threads", dest="num_threads", type=int,
                        help="torch threads per process (default: CPU cores / processes on this node)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or table")


def cmd_run(args) -> Optional[dict]:
    overrides = {key: getattr(args, key, None) for key in _SETTINGS}
    return run(args.model, args.prompts, args.modes, args.out, seed=args.seed, batch_size=args.batch_size,
               coupling=args.coupling, generate_kwargs=overrides, quiet=args.quiet, num_threads=args.num_threads)
