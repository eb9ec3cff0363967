"""The ``csd`` command (commands.py: its subcommands, flags and outputs)."""

from .commands import main

__all__ = ["main"]
