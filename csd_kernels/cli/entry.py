"""``csd`` (also ``python -m csd_kernels`` and ``python -m csd_kernels.cli``): parse the command line, refuse bad flags,
then run the subcommand. Everything up to the subcommand is torch-free (parser.py), so ``csd --help``, ``csd
--version`` and a refused flag answer without importing torch; commands.py, which needs it, loads only then."""

from __future__ import annotations

import sys
from typing import Optional

from ..config.rules import ArgumentError
from ..runner.usage import UsageError, flag_error
from .parser import build_parser, check_flags

__all__ = ["main"]

_CLI_EXTRAS = ("transformers", "safetensors", "tqdm", "PIL", "matplotlib", "sklearn")  # setup.py's [cli] extra


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_flags(args)
        from . import commands  # torch, the models: only now

        getattr(commands, args.handler)(args)
    except (UsageError, ArgumentError) as exc:  # the API's ArgumentError names a keyword: say the flag
        exc = flag_error(exc) if isinstance(exc, ArgumentError) else exc
        print(f"csd {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in _CLI_EXTRAS:
            raise
        print(f"csd {args.command}: error: {exc.name} is not installed; the csd command needs the [cli] extra: "
              "pip install 'csd-kernels[cli]'", file=sys.stderr)
        return 2
    return 0
