"""What a prompt of a ``csd --model`` is, checked without torch and without the model, so that the command refuses a
bad prompt before it loads anything: a list of prompts (never one string), class ids, non-empty text. Errors are
ValueErrors of one line that quote at most ~80 characters of a long prompt."""

from __future__ import annotations

from ..fileio.inputs import quote

__all__ = ["prompt_list", "class_ids", "class_id_texts", "text_prompts"]


def prompt_list(prompts) -> list:
    """``prompts`` as a list, refused when it is one string (its characters would be taken for prompts), not a
    sequence, or empty."""
    if isinstance(prompts, (str, bytes)):
        raise ValueError(f"prompts: expected a list of prompts, got one {type(prompts).__name__} {quote(prompts)} "
                         "(its characters would be taken for prompts; pass [prompt])")
    try:
        prompts = list(prompts)
    except TypeError:
        raise ValueError(f"prompts: expected a list of prompts, got a {type(prompts).__name__}") from None
    if not prompts:
        raise ValueError("prompts: the list is empty; give at least one prompt")
    return prompts


_MAX_DIGITS = 18  # of a class id (leading zeros aside): int64, and no Python limit on the digits of an int


def _class_id(prompt):
    """The int a class-id prompt names: ASCII digits only ("４" is refused: the figures' fonts may lack it), at
    most _MAX_DIGITS of them; None for anything else."""
    text = str(prompt).strip()
    if isinstance(prompt, bool) or not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > _MAX_DIGITS:
        return None
    return int(text)


def class_ids(prompts, classes: int, model: str) -> list[int]:
    """The class ids that class-conditional prompts name ("3"); ValueError for one outside 0..classes-1."""
    ids = []
    for prompt in prompt_list(prompts):
        value = _class_id(prompt)
        if value is None or not 0 <= value < classes:
            raise ValueError(f"prompt {quote(prompt)}: {model} takes a class id 0..{classes - 1}")
        ids.append(value)
    return ids


def class_id_texts(prompts) -> None:
    """Prompts of a class-conditional checkpoint whose class count is read with it: each a non-negative int (of at
    most _MAX_DIGITS ASCII digits)."""
    for prompt in prompt_list(prompts):
        if _class_id(prompt) is None:
            raise ValueError(f"prompt {quote(prompt)}: expected a class id, an int >= 0 in ASCII digits")


def text_prompts(prompts) -> None:
    """Prompts of a text-conditional model: each a non-empty string."""
    for prompt in prompt_list(prompts):
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"prompt {quote(prompt)}: expected a non-empty text")
