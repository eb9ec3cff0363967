"""Lumina-mGPT: checkpoints in the release's format -> transformers' Chameleon (csd_kernels.models.lumina.checkpoint),
the adapter's logits and greedy tokens against Lumina-mGPT's own code, prompt ids against its solver.

Golden values come from tests/fixtures/lumina/, written by scripts/upstream/lumina_fixtures.py with Lumina-mGPT's
code (transformers 4.44). The tiny checkpoints are rebuilt here from their seed (tests/lumina_tiny.py) in the layout
upstream's save_pretrained wrote, and checked byte for byte against the digests upstream recorded. CPU only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lumina_tiny as tiny
import pytest
import torch

from csd_kernels.config.acceptance import rule_named
from csd_kernels.config.modes import MODE_TABLE
from csd_kernels.decoding import MODES, GenerationConfig, generate
from csd_kernels.models import LUMINA_DEFAULTS, LuminaMGPT, get_adapter, load_lumina_mgpt, lumina_grid, lumina_prompt

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parent / "fixtures" / "lumina"
CASES = sorted(tiny.CASES)
HEAD_DIM = tiny.BASE_CONFIG["hidden_size"] // tiny.BASE_CONFIG["num_attention_heads"]


def _fixture(case: str) -> dict:
    return json.loads((FIXTURES / f"{case}.json").read_text())


def _weights(fx: dict) -> dict:
    return tiny.seeded_weights({name: t["shape"] for name, t in fx["tensors"].items()}, fx["seed"])


def _weight_map(fx: dict):
    return None if fx["index"] is None else fx["index"]["weight_map"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case -> a checkpoint folder as upstream wrote it (config.json, safetensors file(s), index)."""
    root = tmp_path_factory.mktemp("lumina")
    out = {}
    for case in CASES:
        fx = _fixture(case)
        out[case] = tiny.write_checkpoint(root / case, fx["config"], _weights(fx), _weight_map(fx))
    return out


@pytest.fixture(scope="module")
def adapters(checkpoints):
    return {case: load_lumina_mgpt(path, grid=tuple(_fixture(case)["grid"]), dtype=torch.float32)
            for case, path in checkpoints.items()}


def _left_padded(prompts: list) -> tuple:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _grid_logits(adapter, prompt: list, codes: list):
    """(cond, uncond) [H*W, V] logits of the adapter for a whole image in one window (CFG on)."""
    adapter.prefill(torch.tensor([prompt]), None, cfg=True)
    inputs = torch.tensor([[0] + codes[:-1]])  # x_{-1} (replaced by the prompt's last token) .. x_{HW-2}
    cond, uncond = adapter.forward(inputs, -1)
    return cond[0], uncond[0]


# ----------------------------------------------------------------------------------------------------------------------
# the checkpoints under test are upstream's
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_rebuilt_checkpoint_is_the_one_upstream_wrote(case, checkpoints):
    from safetensors import safe_open

    fx = _fixture(case)
    config = json.loads((checkpoints[case] / "config.json").read_text())
    assert config["architectures"] == ["ChameleonXLLMXForConditionalGeneration"] and config["model_type"] == "chameleon"
    assert {"dropout", "z_loss_weight", "mask_image_logits", "rope_theta", "model_parallel_size"} <= set(config)
    seen = {}
    for file in sorted(checkpoints[case].glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            seen.update({name: (f.get_tensor(name), file.name) for name in f.keys()})
    assert sorted(seen) == sorted(fx["tensors"])
    for name, (tensor, file) in seen.items():
        assert tiny.tensor_digest(tensor) == fx["tensors"][name]["digest"], name
        assert file == fx["tensors"][name]["file"]
    mp = config["model_parallel_size"]
    assert list(seen["model.layers.0.self_attn.q_norm.weight"][0].shape) == [mp, HEAD_DIM]
    assert not any(name.startswith("model.vqmodel.") for name in seen)  # the release layout: no VQ encoder


# ----------------------------------------------------------------------------------------------------------------------
# against Lumina-mGPT's own modeling code and solver
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_logits_match_upstream(case, adapters):
    fx = _fixture(case)
    cond, uncond = _grid_logits(adapters[case], fx["prompts"][0], fx["codes"])
    for name, ours in (("cond", cond), ("uncond", uncond)):
        ref = fx[name]
        torch.testing.assert_close(ours[:, fx["columns"]], torch.tensor(ref["columns"]), atol=5e-5, rtol=0)
        torch.testing.assert_close(torch.logsumexp(ours, -1), torch.tensor(ref["logsumexp"]), atol=5e-5, rtol=0)
        assert ours.argmax(-1).tolist() == ref["argmax"], name


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_match_upstream_in_every_mode(case, adapters):
    fx = _fixture(case)
    ids, mask = _left_padded(fx["prompts"])  # two prompts of different length: a left-padded batch
    # upstream's checkpoint here holds no VQ: the modes that need its codebook run on the tiny Chameleon
    # (test_adapters), and here must say so
    assert adapters[case].codebook() is None
    for mode in MODES:
        if MODE_TABLE[mode].rule and rule_named(MODE_TABLE[mode].rule).needs_neighbours:
            with pytest.raises(ValueError, match="needs the model's codebook"):
                generate(adapters[case], ids, attention_mask=mask, mode=mode, window=5, temperature=0)
            continue
        out = generate(adapters[case], ids, attention_mask=mask, mode=mode, window=5, cfg_scale=fx["cfg_scale"],
                       temperature=0)
        assert out.tokens.tolist() == fx["greedy"], mode


def test_bf16_default_dtype_stays_within_bf16_of_upstream(checkpoints):
    fx = _fixture("mp1")
    adapter = load_lumina_mgpt(checkpoints["mp1"], grid=tuple(fx["grid"]))  # dtype: config torch_dtype
    assert adapter.model.lm_head.weight.dtype == torch.bfloat16
    assert adapter.model.model.rotary_emb.inv_freq.dtype == torch.float32
    cond, _ = _grid_logits(adapter, fx["prompts"][0], fx["codes"])
    # |logits| < 16: a bf16 ulp is 1/16 there; a few ulps of accumulated rounding
    torch.testing.assert_close(cond.float()[:, fx["columns"]], torch.tensor(fx["cond"]["columns"]), atol=0.25, rtol=0)


def test_prompt_ids_match_upstream_solver():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(FIXTURES / "tokenizer"))
    prompts = json.loads((FIXTURES / "prompts.json").read_text())
    assert len(prompts) >= 3
    for p in prompts:
        assert lumina_prompt(tokenizer, p["text"], p["width"], p["height"]) == p["ids"], p["text"]
    with pytest.raises(ValueError, match="multiples of 32"):
        lumina_prompt(tokenizer, "a fox", 700, 768)
    with pytest.raises(ValueError, match="<|image|>"):
        lumina_prompt(tokenizer, "<|image|> a fox", 768, 768)


# ----------------------------------------------------------------------------------------------------------------------
# conversion rules
# ----------------------------------------------------------------------------------------------------------------------
def test_qk_norms_repeat_interleave_per_shard(checkpoints, adapters):
    fx = _fixture("mp2")
    weights = _weights(fx)
    layer = adapters["mp2"].model.model.layers[1].self_attn
    heads, kv_heads, mp = 4, 2, 2
    for norm, n in (("q_norm", heads), ("k_norm", kv_heads)):
        for part in ("weight", "bias"):
            stored = weights[f"model.layers.1.self_attn.{norm}.{part}"].float()  # [mp, head_dim]
            loaded = getattr(getattr(layer, norm), part)  # [n, head_dim]
            assert torch.equal(loaded, stored.repeat_interleave(n // mp, 0)), (norm, part)
            if n // mp > 1:  # heads of one shard share a row; a tiling would alternate the shards' rows
                assert not torch.equal(loaded, stored.repeat(n // mp, 1))


def test_every_parameter_comes_from_the_checkpoint(adapters):
    fx = _fixture("mp1")
    weights = _weights(fx)
    model = adapters["mp1"].model
    assert not hasattr(model.model, "vqmodel")  # no randomly initialised VQ encoder
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(weights)
    for name, p in params.items():
        stored = weights[name].float()
        if ".self_attn.q_norm." in name or ".self_attn.k_norm." in name:  # [1, head_dim]: one row for every head
            assert stored.shape == (1, HEAD_DIM)
            stored = stored.expand_as(p)
        assert torch.equal(p, stored), name
    assert model.config.rope_parameters["rope_theta"] == fx["config"]["rope_theta"]
    assert _fixture("mp2")["config"]["rope_theta"] == adapters["mp2"].model.config.rope_parameters["rope_theta"]
    assert adapters["mp2"].model.config.swin_norm and not model.training


def test_vq_encoder_tensors_are_ignored_by_name(tmp_path):
    fx = _fixture("mp1")
    weights = _weights(fx)
    weights["model.vqmodel.quantize.embedding.weight"] = torch.zeros(16, 8, dtype=torch.bfloat16)
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    path = tiny.write_checkpoint(tmp_path / "ckpt", fx["config"], weights)
    adapter = load_lumina_mgpt(path, grid=(4, 6), dtype=torch.float32)
    assert not hasattr(adapter.model.model, "vqmodel")


def _broken(tmp_path, config_change=None, weights_change=None):
    fx = _fixture("mp2")
    config, weights = dict(fx["config"]), _weights(fx)
    if config_change:
        config_change(config)
    if weights_change:
        weights_change(weights)
    return tiny.write_checkpoint(tmp_path / "broken", config, weights)


@pytest.mark.parametrize("change, message", [
    (dict(weights_change=lambda w: w.pop("lm_head.weight")), r"missing tensors: lm_head\.weight \[8832, 32\]"),
    (dict(weights_change=lambda w: w.update({"model.layers.0.self_attn.q_norm.weight": torch.ones(3, HEAD_DIM)})),
     r"shapes no rule converts: model\.layers\.0\.self_attn\.q_norm\.weight \[3, 8\] \(expected \[2, 8\] "
     r"\(a row per model-parallel shard\) or \[4, 8\] \(a row per head\)\)"),
    (dict(weights_change=lambda w: w.update({"model.norm.weight": torch.ones(33)})),
     r"model\.norm\.weight \[33\] \(expected \[32\]\)"),
    (dict(weights_change=lambda w: w.update({"model.layers.0.self_attn.gate.weight": torch.ones(2)})),
     r"unknown tensors: model\.layers\.0\.self_attn\.gate\.weight \[2\]"),
    (dict(config_change=lambda c: c.update(architectures=["LlamaForCausalLM"])),
     r"architectures \['LlamaForCausalLM'\] are not Lumina-mGPT's"),
    (dict(config_change=lambda c: c.update(model_type="llama")), r"model_type 'llama'"),
    (dict(config_change=lambda c: c.update(qk_layernorm_eps=1e-6)), r"unknown config fields \['qk_layernorm_eps'\]"),
    (dict(config_change=lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0})), r"rope_scaling"),
    (dict(config_change=lambda c: c.update(model_parallel_size=4)), r"model_parallel_size 4 does not split"),
    (dict(config_change=lambda c: c.update(tie_word_embeddings=True)), r"tie_word_embeddings"),
])
def test_unconvertible_checkpoints_raise_one_clear_error(tmp_path, change, message):
    path = _broken(tmp_path, **change)
    with pytest.raises(ValueError, match=message):
        load_lumina_mgpt(path, grid=(4, 6))


def test_missing_files_raise_one_clear_error(tmp_path, checkpoints):
    with pytest.raises(ValueError, match="not a directory"):
        load_lumina_mgpt(checkpoints["mp1"] / "config.json")
    with pytest.raises(ValueError, match="not a directory"):
        load_lumina_mgpt(tmp_path / "nowhere")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(checkpoints["mp1"] / "config.json", no_weights)
    torch.save({}, no_weights / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"no model\.safetensors.*pytorch_model\.bin.*only safetensors"):
        load_lumina_mgpt(no_weights)
    sharded = tmp_path / "sharded"
    shutil.copytree(checkpoints["mp2"], sharded)
    next(sharded.glob("model-00001-*.safetensors")).unlink()
    with pytest.raises(ValueError, match="shards named in model.safetensors.index.json are missing"):
        load_lumina_mgpt(sharded)
    with pytest.raises(ValueError, match="checkpoint folder or a ChameleonForConditionalGeneration"):
        load_lumina_mgpt(object())


# ----------------------------------------------------------------------------------------------------------------------
# the adapter's family defaults
# ----------------------------------------------------------------------------------------------------------------------
def test_default_grid_and_sampling_defaults(checkpoints, adapters):
    assert lumina_grid(768, 768) == (48, 48) and lumina_grid(1024, 512) == (32, 64)
    adapter = load_lumina_mgpt(adapters["mp1"].model)  # an already-built Chameleon: wrapped
    assert adapter.model is adapters["mp1"].model and adapter.grid == (48, 48)
    assert adapter.image_prefix_ids == [8197, 8828, 8828]  # <racm3:break>, <reserved08824> x 2 for 768 px
    assert get_adapter(adapter.model).grid == (48, 48)
    assert adapter.defaults == LUMINA_DEFAULTS == GenerationConfig(top_k=2000, cfg_scale=3.0, temperature=1.0)
    small = LuminaMGPT(adapters["mp1"].model, grid=(4, 6))
    out = generate(small, torch.tensor([_fixture("mp1")["prompts"][0]]), mode="csd", window=5, seed=0,
                   **small.defaults)
    assert out.tokens.shape == (1, 24) and int(out.tokens.max()) < 8192
    assert out.sequences[0, :3].tolist() == [8197, 8806, 8807] and out.sequences[0, -1] == 8196
