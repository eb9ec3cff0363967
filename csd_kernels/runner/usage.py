"""What the command line and the runner share: the error a bad command line raises, how the API's argument errors
become flag errors, and the output-folder checks (none of which creates or removes anything until work is done)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Optional

from ..config.rules import ArgumentError
from ..fileio.inputs import shorten

__all__ = ["UsageError", "flag_error", "as_flags", "writable_dir", "check_out", "GENERATE_FILES", "claim_generate_dir"]


class UsageError(ValueError):
    """A bad command line: printed as one line and exit status 2."""


def flag_error(exc: ArgumentError, flag: Optional[str] = None) -> UsageError:
    """The API's ArgumentError as the command line says it: ``--window 0: expected an int >= 1``."""
    flag = flag or "--" + exc.name.replace("_", "-")
    return UsageError(f"{flag} {shorten(exc.value)}: expected {exc.expected.removeprefix('None or ')}")


@contextlib.contextmanager
def as_flags(**flags: str):
    """ArgumentErrors raised inside become UsageErrors naming the flag (``flags``: keyword -> flag when the flag is
    not the keyword with dashes, e.g. tvd_threshold="--taus")."""
    try:
        yield
    except ArgumentError as exc:
        raise flag_error(exc, flags.get(exc.name)) from exc


def writable_dir(path: str, flag: str = "--out") -> str:
    """``path``, created if needed; UsageError naming ``flag`` when it cannot be created or written."""
    check_out(path, flag)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create the folder ({exc.strerror})") from exc
    if not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: the folder is not writable")
    return path


def check_out(path: str, flag: str = "--out") -> str:
    """UsageError naming ``flag`` unless ``path`` is a writable folder or could be created as one; creates nothing."""
    if not path:
        raise UsageError(f"{flag}: give a folder")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path}: exists and is not a folder")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{flag} {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {existing} is not writable")
    if existing != os.path.abspath(path):
        _probe_create(path, existing, flag)
    return path


def _probe_create(path: str, existing: str, flag: str) -> None:
    """Creates the missing folders of ``path`` and removes them again: a folder that cannot be made (/proc, a
    read-only mount) is refused now, before the work, and nothing is left."""
    missing, folder = [], os.path.abspath(path)
    while folder != existing:
        missing.insert(0, folder)
        folder = os.path.dirname(folder)
    made = []
    try:
        for folder in missing:
            try:
                os.mkdir(folder)
            except FileExistsError:  # made meanwhile (another rank's probe, or its run): creatable, and not ours
                continue
            made.append(folder)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create the folder ({exc.strerror})") from None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):  # another rank may have made a folder inside it meanwhile
                os.rmdir(folder)


# ----------------------------------------------------------------------------------------------------------------------
# csd generate's folder: stats.json (with "command": "csd generate") marks it; a rerun replaces its files, all at once
# (fileio.outputs.Output with replaces=GENERATE_FILES)
# ----------------------------------------------------------------------------------------------------------------------
GENERATE_FILES = re.compile(r"img_\d{3,}\.png|grid\.png|maps\.png|tokens\.json|stats\.json")
_STATS_KEYS = {"model", "prompt", "mode", "num", "seed", "parameters"}  # stats.json of csd generate, any version


def claim_generate_dir(path: str, flag: str = "--out") -> None:
    """Refuses a folder holding files csd generate did not write, unless its stats.json says csd generate owns it.

    An empty or missing folder, or one of only csd generate's file names, is fine; creates nothing."""
    check_out(path, flag)
    if not os.path.isdir(path) or _generate_stats(os.path.join(path, "stats.json")):
        return
    foreign = sorted(name for name in os.listdir(path)  # (a stats.json here is not csd generate's)
                     if os.path.isfile(os.path.join(path, name)) and (name == "stats.json"
                                                                      or not GENERATE_FILES.fullmatch(name)))
    if foreign:
        raise UsageError(f"{flag} {path}: the folder holds files csd generate did not write ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}) and it replaces its folder's images: give an empty "
                         "or new folder")


def _generate_stats(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            stats = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(stats, dict) and (stats.get("command") == "csd generate" or _STATS_KEYS <= set(stats))
