"""The adapter protocol between :func:`csd_kernels.generate` and a concrete image generator.

The decoding loop only knows the image *grid*: token indices ``0 .. H*W-1`` in raster order, each an id in the image
vocabulary ``0 .. V-1``. An adapter owns everything model-specific: the prompt layout, the classifier-free-guidance
(CFG) unconditional rows, forced tokens the model expects between grid tokens (e.g. Lumina-mGPT's row-end tokens),
the mapping of grid indices to KV-cache lengths, and pixels.

Grid-index convention (Jacobi bookkeeping). Write ``x_k`` for the grid token at index ``k`` and ``x_{-1}`` for the
prompt's final token. The model input that predicts ``x_n`` is ``x_{n-1}`` (plus whatever forced tokens the adapter
inserts in between). So:

* ``prefill`` runs the prompt *without* its final token (zero model calls for a one-token prompt);
* ``forward(tokens, first)`` feeds the inputs ``x_first .. x_{first+L-1}`` (``first >= -1``; at ``first = -1`` the
  value in ``tokens[:, 0]`` is ignored and the prompt's final token is used) and returns logits that predict
  ``x_{first+1} .. x_{first+L}``: exactly ONE target-model call;
* ``crop(first)`` drops the cached inputs from ``x_first`` on, so that the next ``forward(.., first)`` is valid.

An adapter is stateful (it holds the KV cache of the current generation); :func:`csd_kernels.generate` calls
``prefill`` once per generation.

Optional: an adapter whose prompts are embeddings rather than token ids (LlamaGen t2i: caption features) implements
``prefill_embeds(prompt_embeds [B, S, C], attention_mask [B, S] or None, cfg) -> model calls``, with the same
contract as ``prefill``; ``generate(model, prompt_embeds=...)`` calls it instead of ``prefill``.

The static form (:class:`StaticImageAdapter`, used by ``generate(..., static=True)``): ``static_cache(window)`` before
``prefill`` makes the prefill allocate a preallocated per-row KV cache (prompt, grid and ``window`` more inputs per
row); then ``forward_static(tokens [B, W], first [B])`` feeds every row W inputs x_{first_b} .. x_{first_b+W-1} at
its own positions and returns (cond, uncond) logits [B, W, V], with no crop, no concatenation and no host sync: the
same tensor shapes every call. Inputs past the grid are allowed (their logits are junk and never used).

Draft trees (``generate(..., tree=(K, D))``, static loop only) also need ``forward_tree(tokens [B, W], first [B],
depth [W], ancestor [W, W] bool)`` — slot s at sequence index first_b + depth[s], written at cache slot first_b + s,
seeing the committed prefix and its ancestors — and ``keep_path(first [B], path [B, L])``, which moves the accepted
path's keys and values into place (slot first_b + k <- slot first_b + path[b, k]), with ``supports_tree`` True.
The loop announces the tree before the prefill, ``static_cache(window, tree=layout)`` (a reference.TreeLayout), so
that an adapter whose tree needs more inputs than W (Lumina-mGPT: a forced row end below some nodes) sizes its cache.

Optional: ``codebook() -> [V, D] tensor or None``, the latent vector of each image token in grid-id order (the VQ
codebook as the pixel decoder looks it up): the lantern rules' neighbour table is made from it
(ck.codebook_neighbours); an adapter without one runs every other mode.
"""

from __future__ import annotations

import inspect
from typing import Optional, Protocol, runtime_checkable

import torch

from .cache import additive_mask, chain_visibility

__all__ = ["ImageAdapter", "StaticImageAdapter", "cache_kwarg", "crop_cache", "new_dynamic_cache", "is_adapter",
           "is_static_adapter", "is_tree_adapter", "to_uint8_images", "PaddedRows"]


@runtime_checkable
class ImageAdapter(Protocol):
    """What :func:`csd_kernels.generate` needs from a model."""

    grid: tuple[int, int]  # (H, W) image tokens
    vocab_size: int  # V: size of the image vocabulary (grid token ids are 0..V-1)

    def prefill(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], cfg: bool) -> int:
        """Start a generation: run input_ids [B, S] (minus the final token) for the conditional rows and, when
        ``cfg``, the unconditional rows. Returns the number of model calls it made (0 or 1)."""
        ...

    def forward(self, tokens: torch.Tensor, first: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """tokens [B, L] int64 = x_first .. x_{first+L-1} -> (cond [B, L, V], uncond [B, L, V] or None) logits that
        predict x_{first+1} .. x_{first+L}. Exactly one call of the target model."""
        ...

    def crop(self, first: int) -> None:
        """Roll the KV cache back so that it holds the prompt and the inputs x_{-1} .. x_{first-1}."""
        ...

    def image_sequence(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, H*W] grid ids -> [B, T] ids of the model's own vocabulary in its layout, forced tokens in
        place."""
        ...

    def decode(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        """tokens [B, H*W] -> [B, H_px, W_px, 3] uint8 images, or None when the adapter has no pixel decoder."""
        ...


@runtime_checkable
class StaticImageAdapter(ImageAdapter, Protocol):
    """The fixed-shape form of the protocol (see the module docstring)."""

    def static_cache(self, window: int, tree=None) -> None:
        """The next ``prefill`` allocates a per-row static cache with room for ``window`` inputs past the grid (and
        for the inputs of draft tree ``tree``, when given)."""
        ...

    def forward_static(self, tokens: torch.Tensor, first: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """tokens [B, W] int64 = x_{first_b} .. x_{first_b+W-1} per row (first [B] int64 >= -1; at first_b = -1
        tokens[b, 0] is ignored and the prompt's final token is used) -> (cond [B, W, V], uncond [B, W, V] or None)
        logits predicting x_{first_b+1} .. x_{first_b+W}. One target-model call, the same shapes every call."""
        ...


_PROTOCOL_METHODS = ("prefill", "forward", "crop", "image_sequence", "decode")


def is_adapter(obj) -> bool:
    """True when obj implements the protocol (duck-typed: the attributes and the five methods exist)."""
    return hasattr(obj, "grid") and hasattr(obj, "vocab_size") and all(
        callable(getattr(obj, m, None)) for m in _PROTOCOL_METHODS
    )


def is_static_adapter(obj) -> bool:
    """True when obj also implements the static form (``static_cache`` and ``forward_static``)."""
    return is_adapter(obj) and all(callable(getattr(obj, m, None)) for m in ("static_cache", "forward_static"))


def is_tree_adapter(obj) -> bool:
    """True when obj runs draft trees (the static form, ``forward_tree``, ``keep_path`` and ``supports_tree``)."""
    return (is_static_adapter(obj) and all(callable(getattr(obj, m, None)) for m in ("forward_tree", "keep_path"))
            and bool(getattr(obj, "supports_tree", False)))


def cache_kwarg(module) -> str:
    """Name of the forward() keyword for the KV cache: ``cache`` in transformers >= 5.2x, ``past_key_values`` before."""
    for cls in type(module).__mro__:  # the first forward() that names either (a subclass may take **kwargs only)
        params = inspect.signature(cls.forward).parameters if "forward" in vars(cls) else {}
        if "cache" in params or "past_key_values" in params:
            return "cache" if "cache" in params else "past_key_values"
    return "past_key_values"


def new_dynamic_cache(config=None):
    """An empty transformers ``DynamicCache`` (built from the config when this transformers version accepts one)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config) if config is not None else DynamicCache()
    except TypeError:  # older transformers
        return DynamicCache()


def crop_cache(cache, length: int) -> None:
    """Shrink a transformers cache to ``length`` positions in place (``Cache.crop`` with the number of tokens to
    remove as a negative count, which means the same thing in every transformers version that has ``crop``)."""
    current = cache.get_seq_length()
    if length > current:
        raise ValueError(f"cannot crop a cache of length {current} to {length}")
    if length < current:
        cache.crop(length - current)


def to_uint8_images(pixels: torch.Tensor) -> torch.Tensor:
    """[B, H, W, 3] floats in [-1, 1] -> uint8 [B, H, W, 3]."""
    return ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


class PaddedRows:
    """Bookkeeping for left-padded rows (prompts of different lengths, or CFG rows with a shorter prompt).

    Holds the 2-D attention mask of the prompt part [R, P] and per-row pad counts. ``step(cache_len, length)``
    returns (attention_mask [R, 1, length, cache_len + length] or None, position_ids [R, length] or None) for a
    forward call that appends ``length`` positions to a cache of ``cache_len``: None/None when no row is padded (the
    model's defaults are then exact and cheaper). The mask is 4-D and additive (``dtype``), which transformers passes
    to attention as it is: its own 2-D mask code would read the padding on the host every call.
    """

    def __init__(self, prompt_mask: Optional[torch.Tensor], dtype: torch.dtype = torch.float32):
        self.dtype = dtype
        # prompt_mask: [R, P] 0/1 (1 = real token) or None (no padding anywhere)
        if prompt_mask is not None and bool((prompt_mask == 1).all()):
            prompt_mask = None
        self.mask = None if prompt_mask is None else prompt_mask.to(torch.long)
        self.pads = None if prompt_mask is None else (1 - self.mask).sum(-1)  # [R]

    def step(self, cache_len: int, length: int):
        if self.mask is None:
            return None, None
        rows, plen = self.mask.shape
        device = self.mask.device
        total = cache_len + length
        if total <= plen:
            valid = self.mask[:, :total] != 0
        else:
            valid = torch.cat([self.mask != 0, torch.ones(rows, total - plen, dtype=torch.bool, device=device)], 1)
        slots = torch.arange(cache_len, total, device=device)[None, :].expand(rows, -1)  # [R, length]
        mask = additive_mask(chain_visibility(slots, total, valid), self.dtype)  # [R, 1, length, total]
        return mask, (slots - self.pads[:, None]).clamp(min=0)
