"""A run's output, all or nothing: :class:`Output` writes every file of a run into a staging folder inside the output
folder and moves them into place together once the whole output is complete; a run that fails at any point (a full
disk, a signal, an exception) leaves the folder exactly as it was, with no temporary file behind, and says so in one
line (:class:`OutputError`). :func:`write_atomic` does the same for one file (``csd run``'s per-image records).

    with Output(folder, replaces=re.compile(r"img_\\d+\\.png")) as out:
        image.save(out.path("img_000.png"))      # a library that writes by path
        out.write_json("stats.json", stats)
    print(out.summary())                         # "wrote img_000.png, stats.json to DIR"

The moves are renames within one file system (the staging folder sits inside the output folder), made with SIGINT
and SIGTERM held, so they happen all or none; every staged file is flushed to disk (fsync) before the first.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from typing import Optional, Pattern, Union

from .signals import Interrupted, signals_held

__all__ = ["Output", "OutputError", "untouched", "write_atomic", "describe_failure", "STAGING_PREFIX", "TMP_SUFFIX"]

STAGING_PREFIX = ".csd-staging-"  # + pid: an Output's staging folder inside its output folder
TMP_SUFFIX = ".tmp"  # write_atomic's temporary file: .NAME.PID.tmp next to NAME
_EARLIER = ".earlier-"  # + NAME: in the staging folder, the earlier file a commit replaces, until it is done


class OutputError(Exception):
    """Writing a run's output failed: ``what`` happened (one line: the reason and the file) and what the user
    still has (``kept``); the command exits with status 1."""

    def __init__(self, what: str, kept: str = ""):
        super().__init__(what)
        self.what, self.kept = what, kept

    def __str__(self) -> str:
        return f"{self.what}: {self.kept}" if self.kept else self.what


def describe_failure(exc: OSError, path: str) -> str:
    """One line for an OSError raised while writing ``path``: a full disk names the mount point it is on."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        return f"{what} on {_mount_point(path)} while writing {path}"
    return f"{exc.strerror or type(exc).__name__} while writing {path}"


def _mount_point(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_atomic(path: str, data: Union[bytes, str], kept: str = "") -> None:
    """``data`` to a temporary file next to ``path``, flushed to disk, then renamed over ``path``: a reader sees the
    old file or the whole new one. On failure the temporary file is removed; an OSError becomes an
    :class:`OutputError` (``kept``: what the user still has)."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(describe_failure(exc, path), kept) from exc
        raise


def untouched(folder: str, earlier: Optional[bool] = None) -> str:
    """What the user has in ``folder`` when a run wrote nothing there: ``earlier``, whether it holds an earlier run
    (by default: whether it holds anything)."""
    if earlier is None:
        earlier = os.path.isdir(folder) and bool(os.listdir(folder))
    return f"the earlier run in {folder} is unchanged" if earlier else f"nothing was written to {folder}"


class Output:
    """The files one run writes into ``folder``: staged under ``folder/.csd-staging-PID/`` and put in place by
    :meth:`commit` (on leaving the ``with`` block without an exception); ``replaces``: the names of an earlier run's
    files, removed at the commit unless this run wrote them again. On an exception the staged files, the staging
    folder and any folder this output created are removed; an OSError becomes an :class:`OutputError`, and an
    OutputError or :class:`~.signals.Interrupted` learns what was kept."""

    def __init__(self, folder: str, replaces: Optional[Pattern] = None):
        self.folder = folder or "."
        self.replaces = replaces
        self.names: list[str] = []  # staged, in the order they were first asked for
        self.removed: list[str] = []  # the earlier run's files the commit removed
        self.replaced: list[str] = []  # the files the commit put in place of files of the same name
        self.committed = False
        self._staging: Optional[str] = None
        self._made: list[str] = []  # folders this output created, outermost first
        self._current = ""  # the file being written (for the error)
        self._moved: list[str] = []  # the files the commit has put in place so far

    # ---------------------------------------------------------------------------------------------------- writing
    def path(self, name: str) -> str:
        """The path to write file ``name`` to now; it reaches ``folder/name`` at the commit."""
        if self.committed or os.path.basename(name) != name or name.startswith(STAGING_PREFIX):
            raise ValueError(f"Output.path({name!r}): a plain file name, before the commit")
        self._current = name
        staging = self._stage()
        if name not in self.names:
            self.names.append(name)
        return os.path.join(staging, name)

    def write(self, name: str, data: Union[bytes, str]) -> None:
        with open(self.path(name), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def write_json(self, name: str, obj, indent: Optional[int] = 2) -> None:
        self.write(name, json.dumps(obj, indent=indent) + "\n")

    def final(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _stage(self) -> str:
        if self._staging is None:
            self._made = _make_folders(self.folder)
            _remove_dead_stagings(self.folder)
            staging = os.path.join(self.folder, f"{STAGING_PREFIX}{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)  # a pid reused after a killed run of ours
            os.mkdir(staging)
            self._staging = staging
        return self._staging

    # ------------------------------------------------------------------------------------------- commit / discard
    def commit(self) -> list[str]:
        """Every staged file into ``folder`` (all or none), then the earlier run's files this run did not write
        again removed; returns the final paths."""
        staged = [name for name in self.names if os.path.isfile(os.path.join(self._staging or "", name))]
        for name in staged:
            self._current = name
            _fsync(os.path.join(self._staging, name))
        self.replaced = [name for name in staged if os.path.exists(self.final(name))]
        self.names = staged
        with signals_held():
            self._keep_earlier(self.replaced)
            try:
                for name in staged:
                    self._current = name
                    os.replace(os.path.join(self._staging, name), self.final(name))
                    self._moved.append(name)
            except BaseException:
                self._roll_back()
                raise
            self.removed = self._remove_earlier(set(staged))
            if self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)
            self.committed = True
        return [self.final(name) for name in staged]

    def _keep_earlier(self, names: list[str]) -> None:
        """A hard link (else a copy) of each earlier file the commit replaces, in the staging folder: what a failed
        rename puts back."""
        for name in names:
            self._current = name
            kept = os.path.join(self._staging, _EARLIER + name)
            try:
                os.link(self.final(name), kept)
            except OSError:  # (a file system without hard links)
                shutil.copy2(self.final(name), kept)

    def _roll_back(self) -> None:
        """After a failed rename: the files already put in place removed, the earlier ones they replaced restored, so
        the folder is as it was (all or none)."""
        for name in reversed(self._moved):
            kept = os.path.join(self._staging, _EARLIER + name)
            try:
                if os.path.exists(kept):
                    os.replace(kept, self.final(name))
                else:
                    os.unlink(self.final(name))
            except OSError:
                continue  # (left as the kept() line says)
            self._moved.remove(name)

    def _remove_earlier(self, written: set) -> list[str]:
        if self.replaces is None or not os.path.isdir(self.folder):
            return []
        earlier = sorted(name for name in os.listdir(self.folder) if name not in written
                         and self.replaces.fullmatch(name) and os.path.isfile(self.final(name)))
        for name in earlier:
            _unlink(self.final(name))
        return earlier

    def discard(self) -> None:
        """Removes what this output staged and the folders it created (when still empty)."""
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        for folder in reversed(self._made):
            try:
                os.rmdir(folder)
            except OSError:
                break

    def kept(self) -> str:
        """What the user still has after :meth:`discard`."""
        if self.committed:
            return f"it had finished: {self.summary()}"
        if self._moved:  # (a rename failed: a file system error, no signal)
            return f"stopped while putting its files in place: {describe(self._moved)} of this run are in {self.folder}"
        earlier = os.path.isdir(self.folder) and any(
            name in self.names or (self.replaces is not None and self.replaces.fullmatch(name))
            for name in os.listdir(self.folder))
        return untouched(self.folder, earlier)

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is None:
            try:
                self.commit()
                return False
            except BaseException as failure:
                exc = failure
        self.discard()
        kept = self.kept()
        if isinstance(exc, OSError) and self._current:  # (a file was being written)
            raise OutputError(describe_failure(exc, self.final(self._current)), kept) from exc
        if isinstance(exc, (OutputError, Interrupted)) and not exc.kept:
            exc.kept = kept
        if exc is not None and kind is None:
            raise exc
        return False

    # ------------------------------------------------------------------------------------------------ reporting
    def summary(self) -> str:
        """One line naming every file the commit wrote (numbered runs shortened: img_000.png … img_015.png)."""
        earlier = ""
        if self.replaced or self.removed:
            earlier = "; they replace the earlier run's files" + (
                f" (its {describe(self.removed)} removed)" if self.removed else "")
        return f"wrote {describe(self.names)} to {self.folder}{earlier}"


def _make_folders(folder: str) -> list[str]:
    """Creates ``folder`` and its missing parents; returns those it created, outermost first."""
    missing, path = [], os.path.abspath(folder)
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        os.mkdir(path)
    return missing[::-1]


def _remove_dead_stagings(folder: str) -> None:
    """Staging folders a killed run (SIGKILL, power loss) left behind: their process is gone."""
    for name in os.listdir(folder):
        pid = name[len(STAGING_PREFIX):]
        if name.startswith(STAGING_PREFIX) and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_NUMBERED = re.compile(r"(.*?)(\d+)(\D*)")


def describe(names: list[str]) -> str:
    """``names`` joined by commas, a run of 3 or more names that differ only in a consecutive number as
    'first … last (N files)'."""
    parts, run = [], []

    def flush():
        if run:
            parts.extend(run if len(run) < 3 else [f"{run[0]} … {run[-1]} ({len(run)} files)"])
            run.clear()

    for name in names:
        match, last = _NUMBERED.fullmatch(name), _NUMBERED.fullmatch(run[-1]) if run else None
        if match and last and (match[1], match[3], len(match[2])) == (last[1], last[3], len(last[2])) \
                and int(match[2]) == int(last[2]) + 1:
            run.append(name)
            continue
        flush()
        run.append(name)
    flush()
    return ", ".join(parts)
