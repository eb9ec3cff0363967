"""Jacobi decoding entered from transformers' own calls: ``generate(custom_generate=...)`` and Janus' image mode.

* :func:`custom_generate_path`: the folder holding ``custom_generate/generate.py`` (shipped in the wheel), for
  ``model.generate(**inputs, custom_generate=path, trust_remote_code=True, mode="sjd", window=16, ...)``
  on an ``Emu3ForConditionalGeneration`` or a ``ChameleonForConditionalGeneration`` in the Lumina-mGPT layout. It
  returns what the stock image-generation call returns: the prompt followed by the image part in the model's own
  vocabulary and layout (rows of codes, each followed by the row-end token, then the model's end tokens), cut to
  the stock call's new-token budget (``max_new_tokens``, else ``max_length`` minus the prompt). Emu3's token grid
  is read from the prompt's size text, as the stock call's ``prefix_allowed_tokens_fn`` has it (``grid=`` overrides).
* :func:`janus_generate_image`: ``JanusForConditionalGeneration.generate(generation_mode="image")``'s arguments and
  return (the image tokens [B, num_image_tokens]), decoded by :func:`csd_kernels.generate`.

The sampling settings are read as the stock call reads them (the model's generation config merged with the
keywords): ``do_sample`` False is greedy (temperature 0), else ``temperature`` / ``top_k`` / ``top_p`` / ``min_p``;
``guidance_scale`` is the CFG scale (Emu3: the unconditional rows are ``negative_prompt_ids``, or the prompt's last
token; Lumina-mGPT: the image part alone, as its inference solver; Janus: the prompt masked to pad but BOS and the
image-start token, as its image mode). Every other keyword goes to :func:`csd_kernels.generate` (``mode``,
``window``, ``seed``, ``coupling``, ``tree``, ``entropy_coef``, ...), and for Chameleon to
:class:`~csd_kernels.models.LuminaMGPT` (``grid``, ``image_token_range``, ``row_end_token_id``, ...). The layout is
forced by the adapter, so a ``prefix_allowed_tokens_fn`` that forces it (the recipe of transformers' Emu3 docs) is
accepted and not called; logits processors, stopping criteria, streamers and assistant models are refused.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import torch

from ..decoding.generate import generate
from ..models import Emu3Adapter, LuminaMGPT

__all__ = ["custom_generate_path", "custom_generate", "janus_generate_image"]

LUMINA_OPTIONS = ("grid", "image_token_range", "row_end_token_id", "image_start_token_id", "image_end_token_id",
                  "size_token_offset", "image_prefix_ids", "decode")


def custom_generate_path() -> str:
    """The folder to pass as ``custom_generate=`` (it holds custom_generate/generate.py)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "custom_generate_repo")


def custom_generate(model, inputs: Optional[torch.Tensor] = None, generation_config=None, logits_processor=None,
                    stopping_criteria=None, prefix_allowed_tokens_fn=None, synced_gpus=None, assistant_model=None,
                    streamer=None, negative_prompt_ids=None, negative_prompt_attention_mask=None,
                    use_model_defaults=None, **kwargs):
    """The body of custom_generate/generate.py: transformers' ``generate`` arguments in, its image-generation output
    out (module docstring). Emu3's token grid is the prompt's own size text (``<|image start|>H*W<|image token|>``,
    read through the model's ``vocabulary_map``); ``grid=(H, W)`` overrides it."""
    del prefix_allowed_tokens_fn, use_model_defaults
    _refuse(logits_processor=logits_processor, stopping_criteria=stopping_criteria, synced_gpus=synced_gpus,
            assistant_model=assistant_model, streamer=streamer)
    prompt, attention_mask, config, options = _arguments(model, inputs, generation_config, kwargs)
    adapter = _adapter(model, prompt, options, negative_prompt_ids, negative_prompt_attention_mask)
    out = generate(adapter, prompt, attention_mask=attention_mask, **_sampling(config, default_cfg=1.0), **options)
    new = out.sequences.to(device=prompt.device, dtype=prompt.dtype)
    budget = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - prompt.shape[1]
    sequences = torch.cat([prompt, new[:, :max(budget, 0)]], 1)
    return _returned(config, sequences)


def janus_generate_image(model, input_ids: Optional[torch.Tensor] = None, attention_mask=None, logits_processor=None,
                         **kwargs):
    """``JanusForConditionalGeneration.generate(input_ids, attention_mask=..., generation_mode="image", ...)`` by
    speculative Jacobi decoding: the same arguments (``guidance_scale`` default 5, as there; ``generation_config``;
    ``do_sample`` / ``temperature`` / ``top_k`` / ``top_p``) plus :func:`csd_kernels.generate`'s (``mode``, ``window``,
    ``seed``, ...); returns the image tokens [B, num_image_tokens] (a GenerateDecoderOnlyOutput with
    ``return_dict_in_generate``)."""
    kwargs.pop("generation_mode", None)
    _refuse(logits_processor=logits_processor)
    prompt, attention_mask, config, options = _arguments(model, kwargs.pop("inputs", input_ids),
                                                         kwargs.pop("generation_config", None),
                                                         dict(kwargs, attention_mask=attention_mask))
    if type(model).__name__ != "JanusForConditionalGeneration":
        raise ValueError(f"janus_generate_image takes a JanusForConditionalGeneration, got {type(model).__name__}")
    out = generate(model, prompt, attention_mask=attention_mask, **_sampling(config, default_cfg=5.0), **options)
    return _returned(config, out.tokens.to(prompt.dtype))


def _arguments(model, inputs, generation_config, kwargs: dict):
    """(prompt [B, S], attention_mask, the generation config as the stock call resolves it, csd options)."""
    kwargs = dict(kwargs)
    prompt = inputs if inputs is not None else kwargs.pop("input_ids", None)
    attention_mask = kwargs.pop("attention_mask", None)
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2:
        raise ValueError(f"the prompt (input_ids) must be a tensor [B, S], got "
                         f"{getattr(prompt, 'shape', type(prompt).__name__)}")
    config, options = model._prepare_generation_config(generation_config, **kwargs)
    if (config.num_beams or 1) > 1 or (config.num_return_sequences or 1) > 1:
        raise ValueError("num_beams and num_return_sequences must be 1: Jacobi decoding samples one image per prompt")
    return prompt, attention_mask, config, options


def _sampling(config, default_cfg: float) -> dict:
    """The csd_kernels settings the stock call's config means: greedy or temperature / top-k / top-p / min-p, CFG."""
    scale = config.guidance_scale
    settings = dict(cfg_scale=float(default_cfg if scale is None else scale))
    if not config.do_sample:
        return dict(settings, temperature=0.0)
    top_p = config.top_p if config.top_p is not None and config.top_p < 1.0 else None
    return dict(settings, temperature=float(1.0 if config.temperature is None else config.temperature),
                top_k=config.top_k or None, top_p=top_p, min_p=config.min_p or None)


def _adapter(model, prompt, options: dict, negative_prompt_ids, negative_prompt_attention_mask):
    """The image adapter of ``model`` (its layout options taken out of ``options``)."""
    name = type(model).__name__
    if name == "Emu3ForConditionalGeneration":
        grid = options.pop("grid", None)
        grid = _emu3_grid_from_prompt(model, prompt) if grid is None else grid
        return Emu3Adapter(model, tuple(grid), negative_prompt_ids=_one_negative_prompt(negative_prompt_ids,
                                                                                        negative_prompt_attention_mask))
    if name == "ChameleonForConditionalGeneration":
        if negative_prompt_ids is not None:
            raise ValueError("Lumina-mGPT's unconditional rows are the image part alone: negative_prompt_ids is not "
                             "used on Chameleon; leave it out")
        layout = {key: options.pop(key) for key in LUMINA_OPTIONS if key in options}
        return LuminaMGPT(model, **layout)
    raise ValueError(f"custom_generate runs Emu3ForConditionalGeneration and ChameleonForConditionalGeneration (the "
                     f"Lumina-mGPT layout), not {name}; Janus: csd_kernels.integrations.transformers."
                     "janus_generate_image")


def _emu3_grid_from_prompt(model, prompt: torch.Tensor) -> tuple:
    """(H, W) from the size text ``<|image start|>H*W<|image token|>`` that Emu3Processor writes into every image
    prompt, read through ``config.vocabulary_map`` (the tokenizer's vocabulary, which Emu3's config carries)."""
    vocabulary = getattr(model.config, "vocabulary_map", None) or {}
    text_of = {i: s.decode() if isinstance(s, bytes) else s for s, i in vocabulary.items()}
    start, wrapper = vocabulary.get("<|image start|>"), vocabulary.get("<|image token|>")
    grids = set()
    for row in prompt.tolist():
        begin = max((j for j, t in enumerate(row) if t == start), default=None)
        end = next((j for j in range(begin + 1, len(row)) if row[j] == wrapper), None) if begin is not None else None
        size = "".join(text_of.get(t, "?") for t in row[begin + 1:end]) if end is not None else ""
        match = re.fullmatch(r"(\d+)\*(\d+)", size)
        if match is None or min(int(match[1]), int(match[2])) < 1:
            raise ValueError("Emu3's token grid: the prompt has no <|image start|>H*W<|image token|> size text that "
                             f"the model's vocabulary_map spells (read {size!r}); pass grid=(H, W) to generate()")
        grids.add((int(match[1]), int(match[2])))
    if len(grids) != 1:
        raise ValueError(f"Emu3's token grid: the prompt's rows ask for different sizes {sorted(grids)}; generate them "
                         "in separate calls")
    return grids.pop()


def _one_negative_prompt(ids, mask):
    """The negative prompt's tokens (padding dropped), one for every row as Emu3Adapter takes it."""
    if ids is None:
        return None
    rows = [[int(t) for t, m in zip(row, keep) if m] for row, keep in
            zip(ids.tolist(), (torch.ones_like(ids) if mask is None else mask).tolist())]
    if any(row != rows[0] for row in rows):
        raise ValueError("negative_prompt_ids: one negative prompt for every row (the rows differ)")
    return rows[0]


def _refuse(**arguments) -> None:
    given = [name for name, value in arguments.items() if value not in (None, False) and not (
        isinstance(value, list) and not value)]
    if given:
        raise ValueError(f"{', '.join(given)}: not supported by speculative Jacobi decoding (the sampling is "
                         "csd_kernels'; pass its settings as keywords)")


def _returned(config, sequences: torch.Tensor):
    if not config.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return GenerateDecoderOnlyOutput(sequences=sequences)
