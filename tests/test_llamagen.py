"""Native LlamaGen (csd_kernels.models.llamagen): upstream agreement, cached Jacobi = recompute, loader errors,
CFG rows and batches.

Golden values come from upstream LlamaGen code (scripts/upstream/llamagen_fixtures.py, tests/fixtures/llamagen/
golden.pt) run on the tiny seeded weights of llamagen_tiny.py, which the tests regenerate and save to tmp_path in the
released checkpoint layout. Tolerances: tokens and uint8 pixels exact (measured; the bound asserted for pixels is
upstream's "within 1 grey level"), probabilities atol 5e-6 (two float32 computations of the same logits differ by a
few ulp: measured max 6.6e-7; a wrong RoPE pair, mask or CFG row moves them by > 1e-2), logits atol 1e-5 (measured 0).
"""

from __future__ import annotations

import argparse
import os

import llamagen_tiny as tiny
import pytest
import torch
from conftest import build_tiny_llama

from csd_kernels.decoding import MODES, generate
from csd_kernels.models import ImageGPT, LlamaGenAdapter, get_adapter, load_llamagen
from csd_kernels.models.llamagen import VQDecoder, gpt_args, left_pad_captions, vq_args
from csd_kernels.models.llamagen.gpt import Transformer
from csd_kernels.models.llamagen.vq import ENCODER_PREFIXES
from csd_kernels.ops.verify import verify

pytestmark = pytest.mark.usefixtures("one_thread")

GOLDEN_PATH = os.path.join(os.path.dirname(__file__), "fixtures", "llamagen", "golden.pt")
GRIDS = {"c2i": tiny.GRID_C2I, "c2i_gqa": tiny.GRID_C2I, "t2i": tiny.GRID_T2I, "t2i_right": tiny.GRID_T2I}
GOLDEN_CASES = ["c2i", "t2i", "t2i_right"]  # t2i_right: right-padded captions (the last condition position is padding)
VQ_CONFIG = dict(tiny.VQ_CONFIG, ch=tiny.VQ_CH)
PROB_ATOL = 5e-6
LOGIT_ATOL = 1e-5


@pytest.fixture(scope="module")
def golden():
    return torch.load(GOLDEN_PATH)


def _weights(golden, name: str) -> dict:
    return tiny.seeded_state_dict(golden["layout"][name])


def _prompt(name: str, rows=slice(None)) -> dict:
    if name.startswith("c2i"):
        return dict(input_ids=torch.tensor(tiny.CLASSES)[rows, None])
    embeds, mask = tiny.captions(left_padded=name != "t2i_right")
    return dict(prompt_embeds=embeds[rows], attention_mask=mask[rows])


@pytest.fixture(scope="module")
def files(golden, tmp_path_factory):
    """Released-layout checkpoint files: GPTs as DDP training checkpoints, the full VQ (encoder included)."""
    root = tmp_path_factory.mktemp("llamagen")
    paths = {}
    for name in ("c2i", "c2i_gqa", "t2i"):
        paths[name] = str(root / f"{name}_T_{GRIDS[name] * tiny.DOWNSAMPLE}.pt")
        torch.save({"model": _weights(golden, name), "steps": 7, "args": argparse.Namespace(gpt_model="GPT-T")},
                   paths[name])
    paths["vq"] = str(root / "vq_ds2_c2i.pt")
    torch.save({"model": _weights(golden, "vq")}, paths["vq"])
    return paths


def _load(files, name: str, **kw) -> LlamaGenAdapter:
    return load_llamagen(files[name], tiny.GPT_CONFIGS[name], downsample=tiny.DOWNSAMPLE, vq=files["vq"],
                         vq_config=VQ_CONFIG, **kw)


@pytest.fixture(scope="module")
def models(files):
    loaded = {name: _load(files, name) for name in ("c2i", "c2i_gqa", "t2i")}
    loaded["t2i_right"] = loaded["t2i"]  # the same weights, the other caption padding
    return loaded


# ----------------------------------------------------------------------------------------------------------------------
# (a) upstream agreement
# ----------------------------------------------------------------------------------------------------------------------
def test_state_dict_layout_is_upstreams(golden):
    for name in ("c2i", "c2i_gqa", "t2i"):
        ours = Transformer(gpt_args(tiny.GPT_CONFIGS[name])).state_dict()
        assert {k: tuple(v.shape) for k, v in ours.items()} == golden["layout"][name], name
    decoder = {k: tuple(v.shape) for k, v in VQDecoder(vq_args(VQ_CONFIG)).state_dict().items()}
    upstream = golden["layout"]["vq"]
    assert decoder == {k: s for k, s in upstream.items() if not k.startswith(ENCODER_PREFIXES)}
    assert any(k.startswith("encoder.") for k in upstream)  # the fixture holds a full VQ, encoder included


@pytest.mark.parametrize("name", GOLDEN_CASES)
@pytest.mark.parametrize("mode", MODES)
def test_greedy_equals_upstream_generate(models, golden, name, mode):
    out = generate(models[name], **_prompt(name), mode=mode, window=5, cfg_scale=tiny.CFG_SCALE, temperature=0)
    assert torch.equal(out.tokens, golden[name]["tokens"])
    assert (out.images.int() - golden[name]["pixels"].int()).abs().max() <= 1


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_first_token_probs_equal_upstream(models, golden, name):
    adapter = models[name]
    prompt = _prompt(name)
    if name.startswith("c2i"):
        adapter.prefill(prompt["input_ids"], None, cfg=True)
    else:
        adapter.prefill_embeds(prompt["prompt_embeds"], prompt["attention_mask"], cfg=True)
    cond, uncond = adapter.forward(torch.zeros(2, 1, dtype=torch.long), -1)  # [B, 1, V] each
    for temperature, top_k in tiny.PROB_SETTINGS:
        res = verify(cond, torch.full((2, 1), -1), None, uncond_logits=uncond, cfg_scale=tiny.CFG_SCALE,
                     temperature=temperature, top_k=top_k or None, return_probs=True)
        expected = golden[name]["probs"][f"T{temperature}_k{top_k}"]
        torch.testing.assert_close(res.probs[:, 0], expected, atol=PROB_ATOL, rtol=0)


def test_vq_pixels_equal_upstream(models, golden):
    for name in GOLDEN_CASES:
        pixels = models[name].decode(golden[name]["tokens"])
        assert pixels.dtype == torch.uint8 and pixels.shape == golden[name]["pixels"].shape
        assert (pixels.int() - golden[name]["pixels"].int()).abs().max() <= 1


def test_grouped_query_attention_equals_upstream_forward(models, golden):
    adapter = models["c2i_gqa"]
    tokens = golden["c2i_gqa"]["tokens"]
    with torch.no_grad():
        logits = adapter.model(_full_inputs(adapter, torch.tensor(tiny.CLASSES), tokens))
    torch.testing.assert_close(logits, golden["c2i_gqa"]["logits"], atol=LOGIT_ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------------------------------
# (b) cached Jacobi forward calls = a full recompute without a cache
# ----------------------------------------------------------------------------------------------------------------------
def _full_inputs(adapter, cond, tokens):
    """[condition embeddings, x_0 ..] -> [R, cls + len(tokens), D]."""
    return torch.cat([adapter.model.embed_condition(cond), adapter.model.tok_embeddings(tokens)], 1)


def _cfg_rows(adapter, name):
    """The [cond; uncond] condition inputs and key mask the adapter's CFG rows must equal."""
    if name.startswith("c2i"):
        labels = torch.tensor(tiny.CLASSES)
        return torch.cat([labels, torch.full_like(labels, adapter.args.num_classes)]), None
    embeds, mask = tiny.captions(left_padded=name != "t2i_right")
    uncond = adapter.model.cls_embedding.uncond_embedding.expand_as(embeds)
    caption = torch.cat([embeds * mask[..., None], uncond])
    mask = torch.cat([mask, mask]).bool()
    valid = torch.cat([mask, torch.ones(len(mask), adapter.args.block_size, dtype=torch.bool)], 1)
    return caption, valid


@pytest.mark.parametrize("name", ["c2i", "c2i_gqa", "t2i", "t2i_right"])
@torch.no_grad()
def test_cached_jacobi_windows_equal_full_recompute(models, name):
    adapter = models[name]
    total = adapter.args.block_size
    cls = adapter.args.cls_token_num
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, tiny.VOCAB, (2, total), generator=gen)
    adapter_prompt = _prompt(name)
    if name.startswith("c2i"):
        adapter.prefill(adapter_prompt["input_ids"], None, cfg=True)
    else:
        adapter.prefill_embeds(adapter_prompt["prompt_embeds"], adapter_prompt["attention_mask"], cfg=True)
    cond, valid = _cfg_rows(adapter, name)
    # (first, length) windows with roll-backs, drafts past the roll-back point redrawn each time
    for first, length in [(-1, 5), (1, 6), (0, 3), (2, 7), (8, 4), (5, total - 6)]:
        adapter.crop(first)
        tokens[:, max(first, 0) :] = torch.randint(0, tiny.VOCAB, (2, total - max(first, 0)), generator=gen)
        inputs = torch.cat([torch.zeros(2, 1, dtype=torch.long), tokens], 1)[:, first + 1 : first + 1 + length]
        got_cond, got_uncond = adapter.forward(inputs, first)  # [B, L, V]
        full = adapter.model(_full_inputs(adapter, cond, torch.cat([tokens, tokens])[:, : total - 1]), 0, None,
                             valid)  # [2B, cls + N - 1, V]
        window = full[:, cls + first : cls + first + length]
        torch.testing.assert_close(torch.cat([got_cond, got_uncond]), window, atol=LOGIT_ATOL, rtol=0)


def test_kv_cache_refuses_out_of_order_writes(models):
    adapter = models["c2i"]
    adapter.prefill(torch.tensor([[1]]), None, cfg=False)
    adapter.forward(torch.zeros(1, 3, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="crop first"):
        adapter.forward(torch.zeros(1, 2, dtype=torch.long), 0)  # the cache holds x_-1 .. x_1
    with pytest.raises(ValueError, match="cannot crop"):
        adapter.crop(5)


# ----------------------------------------------------------------------------------------------------------------------
# (c) loader: wrappers, and every error path names its keys and shapes
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wrapper", ["model", "module", "state_dict", None])
def test_every_checkpoint_wrapper_loads(golden, tmp_path, wrapper):
    weights = _weights(golden, "c2i")
    path = tmp_path / "c2i_T_12.pt"
    torch.save(weights if wrapper is None else {wrapper: weights, "steps": 1}, path)
    adapter = load_llamagen(str(path), tiny.GPT_CONFIGS["c2i"])
    out = generate(adapter, _prompt("c2i")["input_ids"], mode="ar", cfg_scale=tiny.CFG_SCALE, temperature=0)
    assert torch.equal(out.tokens, golden["c2i"]["tokens"]) and out.images is None


def test_preset_config_and_defaults(golden, tmp_path):
    args = gpt_args("GPT-B", image_size=256)
    assert (args.dim, args.n_layer, args.n_head, args.block_size, args.cls_token_num) == (768, 12, 12, 256, 1)
    assert args.class_rows == 1001 and args.vocab_size == 16384
    t2i = gpt_args("GPT-XL", image_size=512, model_type="t2i")
    assert (t2i.n_layer, t2i.dim, t2i.grid, t2i.cls_token_num) == (36, 1280, 32, 120)
    assert vq_args("VQ-16").downsample == 16 and vq_args("VQ-8").downsample == 8
    adapter = load_llamagen(_weights(golden, "c2i"), tiny.GPT_CONFIGS["c2i"], dtype=torch.bfloat16)
    assert adapter.defaults == dict(cfg_scale=4.0, top_k=2000, temperature=1.0)  # upstream sample_c2i.py
    assert adapter.model.output.weight.dtype == torch.bfloat16 and adapter.model.rope.dtype == torch.float32
    out = generate(adapter, _prompt("c2i")["input_ids"], mode="sjd", window=4, cfg_scale=2.0, seed=0)
    assert out.tokens.shape == (2, tiny.GRID_C2I**2)


def _load_error(weights, config=None, **kw) -> str:
    with pytest.raises(ValueError) as info:
        load_llamagen(weights, tiny.GPT_CONFIGS["c2i"] if config is None else config, **kw)
    return str(info.value)


def test_gpt_key_errors_name_the_keys_and_shapes(golden):
    weights = _weights(golden, "c2i")
    missing = {k: v for k, v in weights.items() if k != "layers.1.ffn_norm.weight"}
    assert "missing keys (1): layers.1.ffn_norm.weight" in _load_error(missing)
    extra = dict(weights, **{"layers.2.attention.wo.weight": torch.zeros(64, 64)})
    assert "unexpected keys (1): layers.2.attention.wo.weight" in _load_error(extra)
    message = _load_error(weights, dict(tiny.GPT_CONFIGS["c2i"], vocab_size=256))
    assert "tok_embeddings.weight: checkpoint (128, 64) vs model (256, 64)" in message
    assert "output.weight: checkpoint (128, 64) vs model (256, 64)" in message
    message = _load_error(weights, dict(tiny.GPT_CONFIGS["c2i"], class_dropout_prob=0.0))  # no null-class row
    assert "cls_embedding.embedding_table.weight: checkpoint (11, 64) vs model (10, 64)" in message
    message = _load_error(weights, "GPT-B", image_size=96, downsample=16)
    assert "missing keys (70)" in message and "layers.11.attention.wqkv.weight" in message  # layers 2..11
    assert "layers.0.attention.wqkv.weight: checkpoint (192, 64) vs model (2304, 768)" in message


def test_gpt_model_type_and_freqs_cis(golden):
    message = _load_error(_weights(golden, "t2i"), dict(tiny.GPT_CONFIGS["t2i"], model_type="c2i", cls_token_num=1))
    assert "cls_embedding.cap_proj.fc1.weight" in message and "pass model_type='t2i'" in message
    weights = _weights(golden, "c2i")
    rope = Transformer(gpt_args(tiny.GPT_CONFIGS["c2i"])).rope
    load_llamagen(dict(weights, freqs_cis=rope), tiny.GPT_CONFIGS["c2i"])  # stored by older upstream revisions
    message = _load_error(dict(weights, freqs_cis=rope[:17]))
    assert "freqs_cis (17, 8, 2) vs (37, 8, 2)" in message


def test_not_a_state_dict(tmp_path):
    assert "not tensors: model, steps" in _load_error({"model": "oops", "steps": 3})
    path = tmp_path / "x.pt"
    torch.save([1, 2], path)
    assert "holds a list" in _load_error(str(path))


def test_config_errors():
    with pytest.raises(ValueError, match="unknown LlamaGen GPT preset 'GPT-Q'"):
        gpt_args("GPT-Q", image_size=256)
    with pytest.raises(ValueError, match=r"unknown LlamaGen GPT config fields \['depth'\]"):
        gpt_args(dict(tiny.GPT_CONFIGS["c2i"], depth=3))
    with pytest.raises(ValueError, match="image_size="):
        gpt_args("GPT-B")
    with pytest.raises(ValueError, match="contradicts"):
        gpt_args(tiny.GPT_CONFIGS["c2i"], image_size=256)
    with pytest.raises(ValueError, match="head_dim=6 must be a multiple of 4"):
        gpt_args(dict(tiny.GPT_CONFIGS["c2i"], dim=24))
    with pytest.raises(ValueError, match="cls_token_num must be 120"):
        gpt_args(dict(tiny.GPT_CONFIGS["t2i"], cls_token_num=77))
    assert gpt_args(dict(tiny.GPT_CONFIGS["c2i"], resid_dropout_p=0.1)).dim == 64  # upstream training fields ignored


def test_vq_errors(golden, files):
    weights = _weights(golden, "vq")
    config = tiny.GPT_CONFIGS["c2i"]

    def vq_error(vq, vq_config=VQ_CONFIG, downsample=tiny.DOWNSAMPLE):
        return _load_error(files["c2i"], config, vq=vq, vq_config=vq_config, downsample=downsample)

    assert "unexpected keys (1): decoder.extra.weight" in vq_error(dict(weights, **{"decoder.extra.weight":
                                                                                    torch.zeros(1)}))
    assert "missing keys (1): post_quant_conv.bias" in vq_error({k: v for k, v in weights.items()
                                                                 if k != "post_quant_conv.bias"})
    message = vq_error(weights, dict(VQ_CONFIG, codebook_embed_dim=8))
    assert "quantize.embedding.weight: checkpoint (128, 4) vs model (128, 8)" in message
    assert "codebook_size=256 != GPT vocab_size=128" in vq_error(weights, dict(VQ_CONFIG, codebook_size=256))
    assert "upsamples 2x but downsample=16" in vq_error(weights, downsample=16)
    decoder_only = {k: v for k, v in weights.items() if not k.startswith(ENCODER_PREFIXES)}
    assert load_llamagen(files["c2i"], config, vq=decoder_only, vq_config=VQ_CONFIG,
                         downsample=tiny.DOWNSAMPLE).vq is not None


# ----------------------------------------------------------------------------------------------------------------------
# (d) prompts, CFG rows and batches through ck.generate
# ----------------------------------------------------------------------------------------------------------------------
def test_prompt_errors(models):
    with pytest.raises(ValueError, match="takes class ids"):
        generate(models["c2i"], **_prompt("t2i"))
    with pytest.raises(ValueError, match="takes caption features"):
        generate(models["t2i"], torch.tensor([[1]]))
    with pytest.raises(ValueError, match=r"class ids must be in 0..9"):
        generate(models["c2i"], torch.tensor([[10]]))
    with pytest.raises(ValueError, match=r"one class id per row"):
        generate(models["c2i"], torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"prompt_embeds must be \[B, 120, 32\]"):
        generate(models["t2i"], prompt_embeds=torch.zeros(1, 120, 16))
    with pytest.raises(ValueError, match="exactly one of input_ids and prompt_embeds"):
        generate(models["t2i"], torch.tensor([[1]]), **_prompt("t2i"))
    with pytest.raises(ValueError, match="exactly one"):
        generate(models["t2i"])
    image_gpt = ImageGPT(build_tiny_llama(24), image_token_range=(0, 16), grid=(2, 2), null_token_id=23)
    with pytest.raises(ValueError, match="ImageGPT takes input_ids, not prompt_embeds"):
        generate(image_gpt, prompt_embeds=torch.zeros(1, 3, 8))


def test_cfg_rows(models):
    c2i = models["c2i"]
    c2i.prefill(torch.tensor([[3], [7]]), None, cfg=True)
    cond, uncond = c2i.forward(torch.zeros(2, 1, dtype=torch.long), -1)
    assert torch.equal(uncond[0], uncond[1]) and not torch.allclose(cond[0], cond[1])  # both rows: the null class
    with torch.no_grad():
        null = c2i.model(c2i.model.embed_condition(torch.tensor([c2i.args.num_classes])))
    torch.testing.assert_close(uncond[:1], null, atol=LOGIT_ATOL, rtol=0)
    c2i.prefill(torch.tensor([[3], [7]]), None, cfg=False)
    assert c2i.forward(torch.zeros(2, 1, dtype=torch.long), -1)[1] is None


@pytest.mark.parametrize("name", ["c2i", "t2i"])
def test_generate_counts_and_shapes(models, forward_counter, name):
    adapter = models[name]
    counter = forward_counter(adapter.model)
    out = generate(adapter, **_prompt(name), mode="csd", window=4, cfg_scale=3.0, seed=1)
    assert out.prefill_passes == (0 if name == "c2i" else 1)
    assert counter.calls == out.forward_passes + out.prefill_passes
    side = GRIDS[name] * tiny.DOWNSAMPLE
    assert out.images.shape == (2, side, side, 3) and torch.equal(out.sequences, out.tokens)
    assert get_adapter(adapter) is adapter and isinstance(get_adapter(adapter.model), LlamaGenAdapter)


@pytest.mark.parametrize("name", ["c2i", "t2i"])
def test_batched_rows_equal_rows_alone(models, name):
    kw = dict(mode="sjd", window=4, cfg_scale=3.0, temperature=1.0, top_k=20)
    batched = generate(models[name], **_prompt(name), seed=[11, 5], **kw)
    alone = [generate(models[name], **_prompt(name, slice(b, b + 1)), seed=[s], **kw).tokens
             for b, s in enumerate([11, 5])]
    assert torch.equal(batched.tokens, torch.cat(alone))


def test_left_pad_captions_as_upstream_sample_script():
    embeds, mask = tiny.captions()  # left-padded
    right = torch.stack([torch.roll(e, -(120 - v), 0) for e, v in zip(embeds, tiny.CAPTION_VALID)])  # T5's layout
    left, left_mask = left_pad_captions(right, mask.flip(-1))
    assert torch.equal(left_mask, mask)
    assert torch.equal(left * mask[..., None], embeds * mask[..., None])
