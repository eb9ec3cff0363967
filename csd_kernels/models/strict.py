"""What the strict checkpoint loaders say about a checkpoint they refuse or partly ignore: one error listing every
missing, unknown and mis-shaped tensor by name (a loader never leaves a tensor randomly initialised)."""

from __future__ import annotations

import logging

__all__ = ["MAX_LISTED", "log_ignored", "raise_problems"]

MAX_LISTED = 12  # problems listed per kind in one error


def raise_problems(where: str, family: str, missing: list, unknown: list, bad_shape: list) -> None:
    """ValueError naming every problem (the first MAX_LISTED of each kind) when there is any."""
    problems = [(kind, items) for kind, items in (("missing tensors", missing), ("unknown tensors", unknown),
                                                  ("shapes no rule converts", bad_shape)) if items]
    if problems:
        text = "; ".join(f"{kind}: " + ", ".join(items[:MAX_LISTED])
                         + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")
                         for kind, items in problems)
        raise ValueError(f"{where}: cannot load as {family}: {text}")


def log_ignored(log: logging.Logger, where: str, ignored: dict) -> None:
    """One info line per reason: the tensors a loader skipped by name."""
    for reason, names in ignored.items():
        log.info("%s: ignored %d tensors (%s ...): %s", where, len(names), names[0], reason)
