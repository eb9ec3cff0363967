"""Golden values for tests/test_janus_pro.py, computed by deepseek-ai/Janus' own code.

Runs OUTSIDE the package, in a venv with the ``janus`` package's dependencies (transformers 4.57):

    python3 -m venv /tmp/janus-venv
    /tmp/janus-venv/bin/pip install torch==2.13.0
    /tmp/janus-venv/bin/pip install 'transformers==4.57.*' 'huggingface_hub<1' 'tokenizers<0.23' einops attrdict \
        pillow safetensors sentencepiece
    /tmp/janus-venv/bin/pip install timm --no-deps
    /tmp/janus-venv/bin/python scripts/upstream/janus_pro_fixtures.py --upstream /path/to/Janus

and writes tests/fixtures/janus_pro/golden.pt:

* per layout of tests/janus_pro_tiny.py (.bin shards + index, one .bin, one safetensors file): the config.json and
  index that deepseek's ``MultiModalityCausalLM.save_pretrained`` wrote, every tensor's name/shape/file/digest;
* per prompt of janus_pro_tiny.PROMPTS, from ``generate`` of deepseek's generation_inference.py itself (its source
  is compiled from --upstream, with sampling made greedy): the CFG rows it builds, the generation head's logits of
  every step (rows interleaved cond/uncond as it builds them), the greedy image tokens, the VQ decode (floats) and
  the uint8 pixels it hands to PIL;
* the understanding path's features (``aligner(vision_model(pixels))``) and the VQ encoder's pre-quantisation
  output for one fixed image, which pin the SigLIP and VQ-encoder key maps.

Adapted at run time, for a CPU-only machine and a tiny model; nothing of Janus is copied:
``torchvision`` is stubbed (imported by the image pre-processing, which text-to-image never runs; its wheel does
not load beside torch 2.13); ``Tensor.cuda`` is the identity; ``torch.multinomial`` takes the argmax (greedy);
``PIL.Image.fromarray`` records its array. deepseek builds VQ-16 and the SigLIP tower from fixed presets whatever
config.json says, so the script shrinks what the presets build (see tests/janus_pro_tiny.py).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "janus_pro"
sys.path.insert(0, str(REPO / "tests"))
import janus_pro_tiny as tiny  # noqa: E402


class _Placeholder(type):
    """A placeholder class whose class attributes are names (enum members such as InterpolationMode.NEAREST)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"


class _StubModule(types.ModuleType):
    """A torchvision module whose every attribute is a placeholder class."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Placeholder(name, (torch.nn.Module,), {})
        setattr(self, name, value)
        return value


class _StubFinder:
    """Imports any ``torchvision.*`` as a _StubModule (timm and the image pre-processing import many)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "torchvision" and not name.startswith("torchvision."):
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, _StubFinder, is_package=True)

    @staticmethod
    def create_module(spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    @staticmethod
    def exec_module(module):
        pass


def stub_torchvision() -> None:
    """An importable torchvision without its compiled ops (the text-to-image path never calls it)."""
    sys.meta_path.insert(0, _StubFinder)


def load_janus(upstream: Path):
    import transformers  # noqa: F401  (first: it must see that torchvision is not installed)

    stub_torchvision()
    sys.path.insert(0, str(upstream))
    from janus.models import MultiModalityCausalLM, siglip_vit, vq_model
    from janus.models.modeling_vlm import MultiModalityConfig

    # the presets that config.json names, shrunk (tests/janus_pro_tiny.py)
    siglip_vit.SigLIP_MODEL_CONFIG["siglip_large_patch16_384"].update(
        width=tiny.VIT_WIDTH, layers=tiny.VIT_LAYERS, heads=tiny.VIT_HEADS, patch_size=tiny.PATCH, mlp_ratio=4)
    for cls in (vq_model.Encoder, vq_model.Decoder):
        defaults = list(cls.__init__.__defaults__)
        names = cls.__init__.__code__.co_varnames[1:cls.__init__.__code__.co_argcount]
        defaults[names.index("ch") - (len(names) - len(defaults))] = tiny.VQ_CH
        cls.__init__.__defaults__ = tuple(defaults)
    vq_16 = vq_model.VQ_models["VQ-16"]
    vq_model.VQ_models["VQ-16"] = lambda: vq_16(codebook_size=tiny.CODEBOOK, z_channels=tiny.VQ_Z)
    return MultiModalityCausalLM, MultiModalityConfig


def generate_function(upstream: Path):
    """``generate`` of generation_inference.py, compiled from its source (the module itself loads a hub model)."""
    path = upstream / "generation_inference.py"
    tree = ast.parse(path.read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "generate")
    namespace = {"torch": torch, "np": __import__("numpy"), "os": os, "PIL": __import__("PIL.Image")}
    namespace["MultiModalityCausalLM"] = namespace["VLChatProcessor"] = object
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["generate"]


class _Processor:
    """What generate() reads of VLChatProcessor: tokenizer.encode and pad_id."""

    def __init__(self, ids):
        self.tokenizer = types.SimpleNamespace(encode=lambda prompt: list(ids))
        self.pad_id = tiny.PAD


def run_generate(model, generate, ids) -> dict:
    import PIL.Image

    record = {"logits": [], "pixels": None, "decoded": None, "codes": None, "rows": None}
    embed = model.language_model.get_input_embeddings()
    hooks = [model.gen_head.register_forward_hook(lambda m, a, out: record["logits"].append(out.detach().clone())),
             embed.register_forward_hook(lambda m, a, out: record.__setitem__("rows", a[0].clone())
                                         if record["rows"] is None else None)]
    decode_code = model.gen_vision_model.decode_code

    def recording_decode(codes, shape=None, channel_first=True):
        record["codes"] = codes.clone()
        out = decode_code(codes, shape=shape, channel_first=channel_first)
        record["decoded"] = out.detach().clone()
        return out

    saved = (torch.Tensor.cuda, torch.multinomial, PIL.Image.fromarray, model.gen_vision_model.decode_code)
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.multinomial = lambda probs, num_samples: probs.argmax(-1, keepdim=True)
    PIL.Image.fromarray = lambda array, *a, **k: (record.__setitem__("pixels", array.copy()), saved[2](array))[1]
    model.gen_vision_model.decode_code = recording_decode
    cwd = os.getcwd()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            generate(model, _Processor(ids), "unused", temperature=1, parallel_size=1, cfg_weight=tiny.CFG,
                     image_token_num_per_image=tiny.GRID ** 2, img_size=tiny.IMAGE_SIZE, patch_size=tiny.PATCH)
    finally:
        os.chdir(cwd)
        torch.Tensor.cuda, torch.multinomial, PIL.Image.fromarray, model.gen_vision_model.decode_code = saved
        for h in hooks:
            h.remove()
    return {"rows": record["rows"].long(), "logits": torch.stack(record["logits"]),  # [steps, 2, V]
            "tokens": record["codes"].long(), "decoded": record["decoded"], "pixels": torch.from_numpy(
                record["pixels"])}


def saved_layout(model, layout: str, root: Path, weights: dict) -> dict:
    from safetensors.torch import load_file

    path = root / layout
    model.save_pretrained(str(path), **tiny.LAYOUTS[layout])
    config = json.loads((path / "config.json").read_text())
    index_files = list(path.glob("*.index.json"))
    index = json.loads(index_files[0].read_text()) if index_files else None
    tensors = {}
    for file in sorted(path.iterdir()):
        if file.suffix == ".safetensors":
            stored = load_file(str(file))
        elif file.suffix == ".bin":
            stored = torch.load(file, weights_only=True)
        else:
            continue
        for name, t in stored.items():
            assert tiny.tensor_digest(t) == tiny.tensor_digest(weights[name]), name
            tensors[name] = {"shape": list(t.shape), "file": file.name, "digest": tiny.tensor_digest(t)}
    assert sorted(tensors) == sorted(weights), "save_pretrained dropped or added tensors"
    return {"config": config, "index": index, "tensors": tensors, "files": sorted(p.name for p in path.iterdir())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, type=Path, help="a deepseek-ai/Janus checkout")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_cls, config_cls = load_janus(args.upstream)
    model = model_cls(config_cls(**tiny.CONFIG)).eval()
    weights = tiny.seeded_weights({n: t.shape for n, t in model.state_dict().items()})
    model.load_state_dict(weights, strict=True)
    generate = generate_function(args.upstream)
    out = {"layouts": {}, "prompts": tiny.PROMPTS, "cfg": tiny.CFG}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in tiny.LAYOUTS:
            out["layouts"][layout] = saved_layout(model, layout, Path(tmp), weights)
    with torch.no_grad():
        out["generate"] = [run_generate(model, generate, ids) for ids in tiny.PROMPTS]
        pixels = torch.randn(1, 3, tiny.IMAGE_SIZE, tiny.IMAGE_SIZE, generator=torch.Generator().manual_seed(3))
        out["image"] = pixels
        out["understanding_features"] = model.aligner(model.vision_model(pixels))
        vq = model.gen_vision_model
        out["vq_encoded"] = vq.quant_conv(vq.encoder(pixels))
    import transformers

    out["versions"] = {"torch": str(torch.__version__), "transformers": str(transformers.__version__)}
    FIXTURES.mkdir(parents=True, exist_ok=True)
    torch.save(out, FIXTURES / "golden.pt")
    for i, g in enumerate(out["generate"]):
        print(f"prompt {i}: tokens {g['tokens'].tolist()} logits {tuple(g['logits'].shape)} "
              f"pixels {tuple(g['pixels'].shape)}")
    print(f"wrote {FIXTURES / 'golden.pt'} ({(FIXTURES / 'golden.pt').stat().st_size} bytes)")


if __name__ == "__main__":
    main()
