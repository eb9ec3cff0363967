"""What a prompt of the scenes model is, from the world's own grammar (:func:`.world.parse_prompt` and its constants:
a new colour, shape, cell or background kind shows here and in the command's errors without an edit). Needs numpy,
not torch: the command refuses a bad scenes prompt before it loads the model."""

from __future__ import annotations

from . import world

__all__ = ["grammar", "check"]


def grammar() -> str:
    """The prompt grammar in one line, its words read from the world."""
    return (f"1 to {world.MAX_OBJECTS} objects 'COLOUR SHAPE CELL' separated by ';' "
            f"(COLOUR: {', '.join(world.COLOURS)}; SHAPE: {', '.join(world.SHAPES)}; "
            f"CELL: {', '.join(world.CELLS)}) and an optional "
            f"'on {'|'.join(world.BACKGROUNDS)}'")


def check(prompts) -> list:
    """The parsed prompts; ValueError, one line, for one outside the grammar."""
    from ...models.prompts import prompt_list

    return [world.parse_prompt(prompt) for prompt in prompt_list(prompts)]
