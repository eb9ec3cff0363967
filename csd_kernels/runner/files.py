"""The files of a run folder (``csd run``), all written atomically.

    DIR/run.json                   the arguments that determine the images (a rerun must match them)
    DIR/.lock                      held by rank 0 while a run is in progress (pid, host)
    DIR/<mode>/<index:06d>.png     the image
    DIR/<mode>/<index:06d>.json    prompt, seed, mode, forward passes, accepted per pass, mean distortion, wall time,
                                   tokens and the sha256 of the PNG bytes
    DIR/logs/rank<r>.log           one log per rank (appended to by every run)
    DIR/summary.json, DIR/summary.txt   written by rank 0 at the end

Every file is written to a temporary name in the same folder and renamed (``fileio.outputs.write_atomic``), so a
killed run never leaves a half-written file under a final name, and a failed write (a full disk) removes its
temporary file; the PNG is written before its JSON, and an image is complete when its JSON parses, belongs to this
run (mode, index, prompt, seed, token count) and holds the sha256 of the PNG bytes on disk. The summary's two files
are put in place together (``fileio.outputs.Output``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import time
from typing import Optional

import numpy as np

from ..config.generation import GenerationConfig
from ..fileio.outputs import TMP_SUFFIX, OutputError, describe_failure, write_atomic
from .usage import UsageError

__all__ = ["MANIFEST", "LOCK", "SUMMARY", "TABLE", "LOG_DIR", "FORMAT", "SETTINGS", "json_bytes",
           "png_bytes", "item_paths", "item_complete", "RunLock", "check_manifest", "clean_temporaries"]

MANIFEST = "run.json"
LOCK = ".lock"
SUMMARY = "summary.json"
TABLE = "summary.txt"
LOG_DIR = "logs"
FORMAT = 1
# the settings a run records in run.json (with the model's defaults filled in), and their flags: GenerationConfig's
# fields that every sampling command takes as a flag
SETTINGS = {name: "--" + name.replace("_", "-") for name in GenerationConfig.names(flag="every")}
_RECORD_KEYS = ("mode", "index", "prompt", "seed", "forward_passes", "accepted", "mean_distortion", "wall_seconds",
                "tokens", "png_sha256")


def json_bytes(obj) -> bytes:
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
                raise self._in_use(owner) from None
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(me, f)
            except BaseException as exc:  # (a full disk: no empty lock that would refuse every rerun)
                os.unlink(self.path)
                if isinstance(exc, OSError):
                    raise OutputError(describe_failure(exc, self.path), "nothing else was written") from exc
                raise
            self.held = True
            return self
        raise UsageError(f"--out {os.path.dirname(self.path)}: could not take the lock {self.path}")

    def check_free(self) -> None:
        """UsageError when a live run holds the lock now: asked before the model loads, so that a second run on a
        folder in use is refused at once (acquire() decides for good)."""
        if not os.path.exists(self.path):
            return
        owner = self._owner()
        if owner is None or not self._stale(owner):
            raise self._in_use(owner)

    def _in_use(self, owner: Optional[dict]) -> UsageError:
        who = (f"pid {owner.get('pid')} on {owner.get('host')}, since {owner.get('started')}" if owner
               else "unreadable lock file")
        return UsageError(f"--out {os.path.dirname(self.path)}: the folder is in use by another run ({who}); "
                          f"wait for it, or remove {self.path} if that run is dead")

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


def check_manifest(out_dir: str, manifest: dict) -> bool:
    """Write run.json, or compare it with the existing one. True when resuming."""
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        write_atomic(path, json_bytes(manifest), kept=f"nothing was written to {out_dir}")
        return False
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--out {out_dir}: {MANIFEST} is unreadable ({exc}); use a new --out folder") from exc
    diffs = []
    for key, flag in [("format", "format"), ("model", "--model"), ("model_options", "the model options"),
                      ("modes", "--modes"), ("seed", "--seed"), ("coupling", "--coupling"), ("tree", "--tree")]:
        if old.get(key) != manifest[key]:
            shown = lambda v: ",".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
            diffs.append(f"{flag} {shown(manifest[key])} (the run has {shown(old.get(key))})")
    if (old.get("num_prompts"), old.get("prompts_sha256")) != (manifest["num_prompts"], manifest["prompts_sha256"]):
        diffs.append(f"--prompts {manifest['prompts_file']} ({manifest['num_prompts']} prompts, other contents than "
                     f"the run's {old.get('prompts_file')}: {old.get('num_prompts')} prompts)")
    old_settings = old.get("generate") or {}
    for key, flag in SETTINGS.items():
        if old_settings.get(key) != manifest["generate"][key]:
            diffs.append(f"{flag} {manifest['generate'][key]} (the run has {old_settings.get(key)})")
    if diffs:
        raise UsageError(f"--out {out_dir} holds a run with other arguments: {'; '.join(diffs)}. Rerun with the "
                         f"run's arguments (see {path}) or use a new --out folder")
    return True


def clean_temporaries(out_dir: str, modes) -> int:
    """Remove temporary files a killed run left behind (only called while holding the lock)."""
    removed = 0
    for folder in [out_dir] + [os.path.join(out_dir, m) for m in modes]:
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name.startswith(".") and name.endswith(TMP_SUFFIX):
                try:
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed
