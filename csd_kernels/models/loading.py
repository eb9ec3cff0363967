"""What the families' ``csd --model`` loaders (models/<family>/command.py) share: where the model goes (device,
dtype), the checks of the paths and options given on the command line, and every failure as one line naming the flag.

``device`` defaults to the GPU when one is visible; ``dtype`` to bfloat16 on a GPU and float32 on the CPU.
"""

from __future__ import annotations

import os
import pickle
from typing import Callable, Optional, TypeVar

import torch

__all__ = ["DTYPES", "left_pad", "loading", "pixel_size", "placement", "refuse_options", "require_path"]

T = TypeVar("T")
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float32": torch.float32, "fp32": torch.float32}


def placement(device: Optional[torch.device], dtype: Optional[str]) -> tuple[torch.device, torch.dtype]:
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: choose from {', '.join(DTYPES)}")
    return device, DTYPES[dtype]


def require_path(path: Optional[str], flag: str, kind: str) -> str:
    """``path``, checked to be the file (or, when ``kind`` ends in "folder", the folder) the flag asks for."""
    if path is None:
        raise ValueError(f"{flag} is required: the path of the {kind}")
    exists = os.path.isdir(path) if kind.endswith("folder") else os.path.isfile(path)
    if not exists:
        what = "folder" if kind.endswith("folder") else "file"
        raise ValueError(f"{flag} {path}: no such {what} (expected the {kind})")
    return path


def refuse_options(name: str, **options) -> None:
    """ValueError naming the flags given that ``--model name`` does not take."""
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        raise ValueError(f"--model {name} takes no {', '.join('--' + k.replace('_', '-') for k in given)}")


def left_pad(rows: list[list[int]], pad: int, device: torch.device) -> dict:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return {"input_ids": ids, "attention_mask": mask}


def pixel_size(size, default: int) -> tuple[int, int]:
    """(width, height) from --size 768 or "768x512" (``default`` when not given)."""
    text = str(default) if size is None else str(size)
    parts = text.lower().split("x")
    try:
        width, height = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except ValueError:
        raise ValueError(f"--size {text}: give pixels as {default} or WIDTHxHEIGHT") from None
    return width, height


def _file_errors() -> tuple:
    """What reading a file that is not a checkpoint raises (torch's unpickler, safetensors, transformers)."""
    errors = (ValueError, OSError, RuntimeError, KeyError, EOFError, TypeError, IndexError, AttributeError,
              pickle.UnpicklingError)
    try:
        from safetensors import SafetensorError
    except ImportError:
        return errors
    return errors + (SafetensorError,)


def loading(flag: str, path: str, kind: str, load: Callable[[], T]) -> T:
    """load(), with any failure as one ValueError line naming the flag and the path."""
    try:
        return load()
    except _file_errors() as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, ValueError) and not isinstance(exc, UnicodeDecodeError):  # our loaders' own messages
            raise ValueError(f"{flag} {path}: {reason}") from exc
        raise ValueError(f"{flag} {path}: not a {kind} ({reason})") from exc
