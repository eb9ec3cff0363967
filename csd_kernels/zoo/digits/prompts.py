"""What a prompt of the digits model is: a class id 0..9 (torch-free, so the command refuses a bad one before it
loads the model)."""

from __future__ import annotations

from ...models.prompts import class_ids

NUM_CLASSES = 10

__all__ = ["NUM_CLASSES", "check"]


def check(prompts) -> list[int]:
    """The class ids of ``prompts``; ValueError, one line, for a prompt that is not one."""
    return class_ids(prompts, NUM_CLASSES, "the digits model")
