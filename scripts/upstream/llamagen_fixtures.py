"""Golden values for tests/test_llamagen.py, computed by upstream LlamaGen code on tiny seeded weights.

    python scripts/upstream/llamagen_fixtures.py /path/to/LlamaGen-checkout [--out tests/fixtures/llamagen]

Runs upstream FoundationVision/LlamaGen (``autoregressive/models/gpt.py``, ``generate.py``,
``tokenizer/tokenizer_image/vq_model.py``; torch only) in this process on the configs and weights of
tests/llamagen_tiny.py and writes ``golden.pt``:

* the state-dict layout ({key: shape}) of every upstream model built (the tests check the package's against it);
* per c2i / t2i (left-padded captions) / t2i_right (right-padded): upstream
  ``generate(..., cfg_scale=4, sample_logits=False)`` greedy tokens; the first-token
  probabilities ``logits_to_probs`` gives for the CFG logits upstream's prefill samples from, at each
  (temperature, top_k) of PROB_SETTINGS; the VQ decoder's pixels of the greedy tokens as upstream's sample scripts
  save them (torchvision ``save_image(normalize=True, value_range=(-1, 1))``: clamp, (x + 1) / 2, ×255 + 0.5,
  truncate to uint8);
* for the grouped-query config: upstream's cache-free forward logits over the c2i greedy tokens.

Nothing of upstream is copied into the package: this script imports it from the checkout given.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))

import llamagen_tiny as tiny  # noqa: E402


def _upstream(checkout: str):
    sys.path.insert(0, checkout)
    from autoregressive.models import generate as gen
    from autoregressive.models import gpt
    from tokenizer.tokenizer_image import vq_model

    return gpt, gen, vq_model


def _commit(checkout: str, given: str) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _fill(module: torch.nn.Module) -> dict:
    """Seeded weights into every state-dict entry (strict); returns the layout {key: shape}."""
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    module.load_state_dict(tiny.seeded_state_dict(shapes), strict=True)
    return shapes


def _gpt(gpt, name: str):
    # dropouts off: upstream applies them only in training mode, eval() is set below anyway
    args = gpt.ModelArgs(**tiny.GPT_CONFIGS[name], token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
    model = gpt.Transformer(args).eval()
    return model, _fill(model)


def _vq(vq_model):
    model = vq_model.VQModel(vq_model.ModelArgs(**tiny.VQ_CONFIG))
    # the tiny decoder (and encoder) width: upstream's Encoder/Decoder constructor argument ch
    common = dict(ch=tiny.VQ_CH, z_channels=tiny.VQ_CONFIG["z_channels"])
    model.encoder = vq_model.Encoder(ch_mult=tiny.VQ_CONFIG["encoder_ch_mult"], **common)
    model.decoder = vq_model.Decoder(ch_mult=tiny.VQ_CONFIG["decoder_ch_mult"], **common)
    model.eval()
    return model, _fill(model)


def _save_image_uint8(images: torch.Tensor) -> torch.Tensor:
    """torchvision save_image(normalize=True, value_range=(-1, 1)) pixels, [B, 3, H, W] -> [B, H, W, 3] uint8."""
    unit = images.clone().clamp_(-1, 1).sub_(-1).div_(2)
    return unit.mul(255).add_(0.5).clamp_(0, 255).permute(0, 2, 3, 1).to(torch.uint8)


def _greedy(gen, model, cond, grid: int, emb_masks=None):
    """Upstream generate (greedy) -> (tokens [B, N], the CFG logits [N, B, V] it handed to sample() per token)."""
    seen = []
    original = gen.sample

    def recording_sample(logits, **kwargs):
        seen.append(logits[:, -1].clone())
        return original(logits, **kwargs)

    gen.sample = recording_sample
    try:
        tokens = gen.generate(model, cond, grid * grid, emb_masks, cfg_scale=tiny.CFG_SCALE, temperature=1.0,
                              top_k=0, top_p=1.0, sample_logits=False)
    finally:
        gen.sample = original
    return tokens.long(), torch.stack(seen)


def _case(gen, model, vq, cond, grid, emb_masks=None) -> dict:
    tokens, logits = _greedy(gen, model, cond, grid, emb_masks)
    probs = {f"T{t}_k{k}": gen.logits_to_probs(logits[0].clone(), temperature=t, top_p=1.0, top_k=k)
             for t, k in tiny.PROB_SETTINGS}
    qzshape = [len(tokens), tiny.VQ_CONFIG["codebook_embed_dim"], grid, grid]
    pixels = _save_image_uint8(vq.decode_code(tokens, qzshape))
    top2 = logits.topk(2, dim=-1).values  # [N, B, 2]
    margin = float((top2[..., 0] - top2[..., 1]).min())  # how far the greedy path is from a float tie
    print(f"  tokens {tuple(tokens.shape)}, smallest greedy top-2 logit gap {margin:.4f}, pixels {tuple(pixels.shape)}")
    return {"tokens": tokens, "probs": probs, "pixels": pixels, "min_gap": margin}


@torch.no_grad()
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", help="a checkout of github.com/FoundationVision/LlamaGen")
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "llamagen"))
    parser.add_argument("--commit", default="", help="upstream commit, when the checkout is not a git work tree")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    gpt, gen, vq_model = _upstream(args.checkout)

    vq, vq_layout = _vq(vq_model)
    golden = {"upstream_commit": _commit(args.checkout, args.commit), "cfg_scale": tiny.CFG_SCALE, "seed": tiny.SEED,
              "layout": {"vq": vq_layout}}

    print("c2i")
    model, golden["layout"]["c2i"] = _gpt(gpt, "c2i")
    golden["c2i"] = _case(gen, model, vq, torch.tensor(tiny.CLASSES), tiny.GRID_C2I)

    model, golden["layout"]["t2i"] = _gpt(gpt, "t2i")
    for case, left in (("t2i", True), ("t2i_right", False)):
        print(case)
        embeds, mask = tiny.captions(left_padded=left)
        cond = embeds * mask[:, :, None]  # as sample_t2i.py: padded rows zeroed
        golden[case] = _case(gen, model, vq, cond, tiny.GRID_T2I, emb_masks=mask)

    print("c2i_gqa (cache-free forward)")
    model, golden["layout"]["c2i_gqa"] = _gpt(gpt, "c2i_gqa")
    tokens = golden["c2i"]["tokens"]
    logits, _ = model(tokens, torch.tensor(tiny.CLASSES))  # [B, 1 + N, V]
    golden["c2i_gqa"] = {"tokens": tokens, "logits": logits}

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "golden.pt")
    torch.save(golden, path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes), upstream {golden['upstream_commit']}")


if __name__ == "__main__":
    main()
