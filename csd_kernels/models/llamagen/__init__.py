"""Native LlamaGen (FoundationVision/LlamaGen): the GPT, the VQ decoder, the checkpoint loader and the adapter.

``load_llamagen(checkpoint, "GPT-B", image_size=256, vq="vq_ds16_c2i.pt")`` returns a :class:`LlamaGenAdapter`
that :func:`csd_kernels.generate` drives (see :mod:`.adapter` for the prompts, :mod:`.loader` for the checks).
"""

from .adapter import C2I_DEFAULTS, T2I_DEFAULTS, LlamaGenAdapter, left_pad_captions
from .gpt import PRESETS, ModelArgs, Transformer
from .loader import gpt_args, load_llamagen, read_state_dict, vq_args
from .vq import VQ_PRESETS, VQArgs, VQDecoder

__all__ = ["C2I_DEFAULTS", "PRESETS", "T2I_DEFAULTS", "VQ_PRESETS", "LlamaGenAdapter", "ModelArgs", "Transformer",
           "VQArgs", "VQDecoder", "gpt_args", "left_pad_captions", "load_llamagen", "read_state_dict", "vq_args"]
