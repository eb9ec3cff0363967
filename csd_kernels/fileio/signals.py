"""SIGINT and SIGTERM as an exception the command can clean up after: :func:`raise_on_signals` makes both raise
:class:`Interrupted`, so ``finally`` blocks and :class:`~.outputs.Output` discard what a stopped run had half written,
and the command prints one line (what was kept) and exits 128 + the signal number (130, 143).

A signal that lands while a module is being imported is raised once the import is done: a module's top level may
run inside native code that cannot pass a Python exception on (torch's import then aborts the process)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["Interrupted", "SIGNALS", "raise_on_signals", "signals_held", "if_stopped"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A run stopped by a signal (a BaseException, like KeyboardInterrupt: ``except Exception`` does not swallow it).

    ``kept``: what the user still has (set by whoever knows, e.g. "3 of 6 images kept in DIR; rerun ...")."""

    def __init__(self, signum: int, kept: str = ""):
        super().__init__(signum)
        self.signum, self.kept = signum, kept

    @property
    def status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}" + (f": {self.kept}" if self.kept else "")


_RETRY_S = 0.01  # how soon a signal put off by an import is delivered again


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (some frame below it is importlib's)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise(signum, frame):
    if _importing(frame):  # deliver it again shortly, until the import is over
        retry = threading.Timer(_RETRY_S, os.kill, (os.getpid(), signum))
        retry.daemon = True
        retry.start()
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def _handled_by(handler):
    """Inside: SIGINT and SIGTERM reach ``handler``; yields the handlers before (restored on exit), or None in a
    worker thread, where signals cannot be handled (they reach the main thread's handlers)."""
    try:
        before = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    except ValueError:  # not the main thread
        yield None
        return
    try:
        yield before
    finally:
        for signum, handler_before in before.items():
            signal.signal(signum, handler_before)


@contextlib.contextmanager
def raise_on_signals():
    """Inside: SIGINT and SIGTERM raise :class:`Interrupted` (in the main thread); the handlers before are restored
    on exit. Elsewhere (a worker thread) it does nothing."""
    with _handled_by(_raise):
        yield


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block is done (a few renames must happen all or none), then reach the
    handler they would have reached. (Held by handlers that note them, not by the signal mask: a process-directed
    signal may land on any thread, e.g. one of torch's, and Python runs the handler in the main thread anyway.)"""
    pending, before = [], None
    try:
        with _handled_by(lambda signum, frame: pending.append(signum)) as before:
            yield
    finally:  # the handlers before are back: a held signal reaches them, whatever the block raised
        for signum in pending[:1]:
            if callable(before[signum]):
                before[signum](signum, None)
            elif before[signum] == signal.SIG_DFL:
                signal.raise_signal(signum)


@contextlib.contextmanager
def if_stopped(kept: str):
    """An :class:`Interrupted` raised inside says ``kept`` (what the user has), unless it already says something."""
    try:
        yield
    except Interrupted as exc:
        exc.kept = exc.kept or kept
        raise
