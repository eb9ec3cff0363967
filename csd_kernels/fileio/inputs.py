"""The files a command reads, checked before anything is loaded from them or written: a folder that must hold some
files, a safetensors file (its header read and checked against the file's size, without torch), a JSON file (a
config.json), a prompts file. A bad one raises :class:`InputError`: one line naming the flag, the path and what is
wrong with it (the command exits with status 2)."""

from __future__ import annotations

import json
import math
import os
from typing import Iterable

__all__ = ["InputError", "SAFETENSORS_DTYPES", "check_finite", "check_folder", "check_safetensors", "read_json",
           "read_prompts", "read_prompt_lines", "quote", "shorten"]

QUOTED = 80  # characters of a long input an error quotes
# bytes per element of each safetensors dtype (the format's own table)
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "I64": 8, "U64": 8, "F64": 8}
_MAX_HEADER = 100 << 20  # the safetensors library refuses a larger header


class InputError(ValueError):
    """A bad input file: ``flag path: what is wrong``, one line."""

    def __init__(self, flag: str, path: str, problem: str):
        self.flag, self.path, self.problem = flag, path, problem
        super().__init__(f"{flag} {path}: {problem}")


def quote(text, limit: int = QUOTED) -> str:
    """``repr(text)``, the middle of a long one elided so that at most ``limit`` characters of it are shown."""
    text = str(text)
    if len(text) <= limit:
        return repr(text)
    half = (limit - 1) // 2
    return repr(text[:half]) + f" … ({len(text)} characters) … " + repr(text[-half:])


def shorten(text, limit: int = QUOTED) -> str:
    """``text`` as is, or with its middle elided when longer than ``limit`` characters."""
    text = str(text)
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return f"{text[:half]} … ({len(text)} characters) … {text[-half:]}"


def _file(path: str, flag: str, what: str) -> None:
    if os.path.isdir(path):
        raise InputError(flag, path, f"is a folder; expected {what}")
    if not os.path.exists(path):
        raise InputError(flag, path, f"no such file (expected {what})")
    if not os.access(path, os.R_OK):
        raise InputError(flag, path, "the file is not readable")


def check_folder(path: str, flag: str, what: str, files: Iterable[str] = ()) -> str:
    """``path``, a folder holding ``files``; InputError naming the first one missing."""
    if not os.path.isdir(path):
        raise InputError(flag, path, f"{'is a file' if os.path.exists(path) else 'no such folder'}; expected {what}")
    missing = [name for name in files if not os.path.isfile(os.path.join(path, name))]
    if missing:
        raise InputError(flag, path, f"no {' and no '.join(missing)} in the folder (expected {what})")
    return path


def read_json(path: str, flag: str, what: str = "a JSON object") -> dict:
    """The JSON object in ``path``; InputError for a missing file, one that is not JSON (with the line and column)
    or JSON that is not an object."""
    _file(path, flag, what)
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except UnicodeDecodeError:
        raise InputError(flag, path, f"not text (expected {what})") from None
    except json.JSONDecodeError as exc:
        raise InputError(flag, path, f"not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                                     f"expected {what}") from None
    except OSError as exc:
        raise InputError(flag, path, f"cannot read the file ({exc.strerror})") from None
    if not isinstance(value, dict):
        raise InputError(flag, path, f"holds a JSON {type(value).__name__}; expected {what}")
    return value


def check_safetensors(path: str, flag: str) -> dict:
    """The header of the safetensors file ``path`` ({tensor name: {dtype, shape, data_offsets}}), checked as the
    format defines it (and as the safetensors library reads it): an 8-byte header length within the file, a JSON
    header, every tensor of a known dtype with as many bytes as its shape holds, the tensors' bytes inside the data,
    none overlapping another, with no gap between them and none after the last (a truncated or damaged file fails
    here, in one line naming the tensor)."""
    _file(path, flag, "a safetensors file")
    size = os.path.getsize(path)

    def bad(problem: str) -> InputError:
        return InputError(flag, path, problem)

    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 2 or length > min(size - 8, _MAX_HEADER):
            raise bad(f"not a safetensors file ({size} bytes; no valid header length at its start)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise bad("not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise bad("not a safetensors file (its header is not a JSON object)")
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    spans = sorted((_tensor_span(name, info, bad), name) for name, info in tensors.items())
    _check_layout(spans, size - 8 - length, bad)
    return tensors


def _tensor_span(name: str, info, bad) -> tuple:
    """(begin, end) of a tensor's bytes in the data; ``bad(problem)`` raised when its entry is not what the format
    writes (a field missing or of the wrong kind, a dtype it does not define, a byte count its shape does not hold)."""
    try:
        begin, stop = info["data_offsets"]
        shape, dtype = info["shape"], info["dtype"]
        valid = isinstance(shape, list) and all(_count(n) for n in (begin, stop, *shape))
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        raise bad(f"not a safetensors file (tensor {quote(name)} has no valid dtype, shape and data_offsets)")
    if dtype not in SAFETENSORS_DTYPES:
        raise bad(f"tensor {quote(name)} has dtype {quote(dtype)}, which safetensors does not define")
    if stop < begin:
        raise bad(f"tensor {quote(name)} ends (byte {stop}) before it begins (byte {begin})")
    if stop - begin != math.prod(shape) * SAFETENSORS_DTYPES[dtype]:
        raise bad(f"tensor {quote(name)} has {stop - begin} bytes; its {dtype} shape {shape} holds "
                  f"{math.prod(shape) * SAFETENSORS_DTYPES[dtype]}")
    return begin, stop


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_layout(spans: list, data: int, bad) -> None:
    """The tensors' bytes, in order of offset, tile the data from byte 0 to its end: no overlap, gap or excess."""
    for (_, stop), name in spans:  # (first: an offset past the end says more than the gap it leaves)
        if stop > data:
            raise bad(f"truncated: tensor {quote(name)} ends at byte {stop} of the data, the file holds {data}")
    end, last = 0, None
    for (begin, stop), name in spans:
        if begin < end:
            raise bad(f"tensors {quote(last)} and {quote(name)} overlap (bytes {begin}..{end} of the data)")
        if begin > end:
            raise bad(f"{begin - end} bytes of the data before tensor {quote(name)} belong to no tensor")
        end, last = stop, name
    if end != data:
        raise bad(f"{data - end} bytes after the last tensor's data (a damaged file)")


def check_finite(tensors: dict, flag: str, path: str) -> dict:
    """``tensors`` ({name: torch tensor}) when every floating-point one is finite; InputError naming the first that
    holds a NaN or an infinity (weights a failed training wrote)."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            bad = int((~tensor.isfinite()).sum())
            raise InputError(flag, path, f"tensor {quote(name)} holds {bad} non-finite values (NaN or infinity) of "
                                         f"{tensor.numel()}")
    return tensors


def read_prompts(path: str, flag: str = "--prompts") -> list[str]:
    """One prompt per non-blank line (surrounding whitespace stripped); InputError for a missing file, a folder, a
    file that is not UTF-8 text or one without prompts."""
    return [prompt for _, prompt in read_prompt_lines(path, flag)]


def read_prompt_lines(path: str, flag: str = "--prompts") -> list[tuple[int, str]]:
    """(line number from 1, prompt) of every non-blank line; the errors of :func:`read_prompts`."""
    _file(path, flag, "a text file, one prompt per line")
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(number, line.strip()) for number, line in enumerate(f, 1) if line.strip()]
    except UnicodeDecodeError as exc:
        raise InputError(flag, path, f"not UTF-8 text (byte {exc.start}); expected one prompt per line") from None
    except OSError as exc:
        raise InputError(flag, path, f"cannot read the file ({exc.strerror})") from None
    if not lines:
        raise InputError(flag, path, "the file has no prompts (one per line expected)")
    return lines
