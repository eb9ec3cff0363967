"""Fixed-width text tables for the terminal (benchmark and compile reports)."""
from __future__ import annotations

from typing import Iterable, Sequence


def text_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[str]]) -> str:
    """A header, a rule of dashes and one line per row. ``columns`` are (title, alignment and width, e.g. "<52" or
    ">6"); each row gives a column's cell already formatted as a string, aligned like its title."""
    line = lambda cells: " ".join(f"{cell:{spec}}" for cell, (_, spec) in zip(cells, columns))  # noqa: E731
    header = line([title for title, _ in columns])
    return "\n".join([header, "-" * len(header), *map(line, rows)])
