"""What the command line and the runner share: the error a bad command line raises, and the output-folder check."""

from __future__ import annotations

import os

__all__ = ["UsageError", "writable_dir"]


class UsageError(ValueError):
    """A bad command line: printed as one line and exit status 2."""


def writable_dir(path: str, flag: str = "--out") -> str:
    """``path``, created if needed; UsageError naming ``flag`` when it cannot be created or written."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create the folder ({exc.strerror})") from exc
    if not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: the folder is not writable")
    return path
