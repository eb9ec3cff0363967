"""The ``csd`` command: entry.py (main: parse, check, dispatch), parser.py (its subcommands and flags, torch-free),
commands.py (what each subcommand does)."""

from .entry import main

__all__ = ["main"]
