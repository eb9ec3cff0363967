"""``csd --model llamagen``: a released class-conditional GPT from the command line.

``weights`` = the GPT ``.pt`` (``c2i_B_256.pt``), ``config`` = its upstream name (``GPT-B``) or a JSON file of
ModelArgs fields (optionally with ``"vq_config"`` and ``"downsample"``), ``image_size`` = its resolution (read from a
``_256``/``_384`` in the file name when not given), ``vq`` = ``vq_ds16_c2i.pt`` for pixels. Prompts are ImageNet
class ids. (Text-conditional LlamaGen needs T5 caption features: use the Python API, ``load_llamagen`` +
``generate(prompt_embeds=...)``.)
"""

from __future__ import annotations

import os
import re
from typing import Optional

import torch

from ...fileio.inputs import read_json
from ..loading import loading, placement, refuse_options, require_path
from ..prompts import class_ids
from ..registry import ZooModel
from .loader import load_llamagen

__all__ = ["load"]


def _config(config: Optional[str]) -> tuple:
    """(GPT config, load_llamagen keywords) from a preset name or a JSON file of ModelArgs fields."""
    if config is None:
        raise ValueError("--config is required for llamagen: the upstream model name, e.g. GPT-B for c2i_B_256.pt")
    if not config.endswith(".json"):
        return config, {}
    fields = read_json(config, "--config", "a JSON object of LlamaGen ModelArgs fields")
    extra = {key: fields.pop(key) for key in ("vq_config", "downsample") if key in fields}
    return fields, extra


def load(device=None, *, weights=None, config=None, vq=None, image_size=None, dtype=None, **options) -> ZooModel:
    refuse_options("llamagen", **options)
    require_path(weights, "--weights", "LlamaGen GPT checkpoint (.pt)")
    if vq is not None:
        require_path(vq, "--vq", "LlamaGen VQ checkpoint (.pt)")
    gpt_config, extra = _config(config)
    if image_size is None:
        found = re.search(r"_(\d{3,4})(?=\D*$)", os.path.basename(weights))
        if found is None:
            raise ValueError(f"--image-size is required: {os.path.basename(weights)} does not name its resolution")
        image_size = int(found.group(1))
    device, torch_dtype = placement(device, dtype)
    adapter = loading("--weights", weights, "LlamaGen checkpoint", lambda: load_llamagen(
        weights, gpt_config, image_size=int(image_size), vq=vq, dtype=torch_dtype, device=device, **extra))
    if adapter.args.model_type != "c2i":
        raise ValueError("--model llamagen runs class-conditional checkpoints; text-conditional ones need T5 caption "
                         "features (Python API: load_llamagen + generate(prompt_embeds=...))")
    classes = adapter.args.num_classes

    def parse(prompts: list[str]) -> dict:
        ids = [[i] for i in class_ids(prompts, classes, "LlamaGen c2i")]
        return {"input_ids": torch.tensor(ids, dtype=torch.long, device=device)}

    return ZooModel("llamagen", adapter, parse, defaults=adapter.defaults,
                    prompt_help=f"an ImageNet class id 0..{classes - 1}")
