"""``csd`` (also ``python -m csd_kernels`` and ``python -m csd_kernels.cli``): parse the command line, refuse bad flags
and prompts, then run the subcommand. Everything up to the subcommand is torch-free (parser.py), so ``csd --help``,
``csd --version``, a refused flag and a refused prompt answer without importing torch; commands.py, which needs it,
loads only then.

Whatever happens, the user reads one line: a bad command line or input file (exit status 2), a failure to write the
output (a full disk: exit status 1, the earlier output untouched), SIGINT / SIGTERM (exit status 130 / 143, what was
kept). A traceback means a bug."""

from __future__ import annotations

import signal
import sys
from typing import Optional

from ..config.rules import ArgumentError
from ..fileio.inputs import InputError
from ..fileio.outputs import OutputError, untouched
from ..fileio.signals import Interrupted, raise_on_signals
from ..runner.usage import UsageError, flag_error
from .parser import build_parser, check_flags

__all__ = ["main"]

_CLI_EXTRAS = ("transformers", "safetensors", "tqdm", "PIL", "matplotlib", "sklearn")  # setup.py's [cli] extra


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    with raise_on_signals():
        try:
            return _run(args)
        except Interrupted as exc:  # stopped before the command said what it keeps: it has written nothing yet
            exc.kept = exc.kept or (untouched(args.out) if getattr(args, "out", None) else "")
            return _say(args, str(exc), exc.status)
        except KeyboardInterrupt:  # (a SIGINT the handler did not see, e.g. outside the main thread)
            return _say(args, str(Interrupted(signal.SIGINT)), 128 + signal.SIGINT)


def _run(args) -> int:
    try:
        check_flags(args)
        from . import commands  # torch, the models: only now

        getattr(commands, args.handler)(args)
    except (UsageError, ArgumentError, InputError) as exc:  # the API's ArgumentError names a keyword: say the flag
        exc = flag_error(exc) if isinstance(exc, ArgumentError) else exc
        return _say(args, f"error: {exc}", 2)
    except OutputError as exc:
        return _say(args, f"error: {exc}", 1)
    except ModuleNotFoundError as exc:
        if exc.name not in _CLI_EXTRAS:
            raise
        return _say(args, f"error: {exc.name} is not installed; the csd command needs the [cli] extra: "
                          "pip install 'csd-kernels[cli]'", 2)
    return 0


def _say(args, message: str, status: int) -> int:
    print(f"csd {args.command}: {' '.join(message.split())}", file=sys.stderr)  # one line
    return status
