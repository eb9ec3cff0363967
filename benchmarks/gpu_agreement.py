"""How often do the backends disagree on a token? Triton (GPU) vs CUDA (GPU) vs the C++ CPU backend, same seeds.

    python benchmarks/gpu_agreement.py [--positions 1048576] [--vocab 4096] [--out DIR]
    python benchmarks/gpu_agreement.py --device cpu --positions 256 --vocab 64 --rows-per-chunk 8 --cpu
                                       (a CPU stand-in: the C++ CPU backend against the torch reference)

GPU calls see --rows-per-call rows each (the split path at the default); the CPU backend verifies whole chunks.
Inputs are Jacobi-like (q = p of slightly perturbed logits, so the CSD gate is open and a(x) is often near u), the
hardest case for agreement. Each chunk rotates through independent / maximal / gumbel next drafts and plain / top-k
sampling. A position disagrees when its token differs; a row disagrees when any token or accept_len differs.
Compiled GPU code uses approximate exp/division where the CPU uses IEEE maths, so a decision can flip only when
u lies within a few ulps of a(x) or of a CDF boundary: the printed rates measure how often that happens.
"""

import argparse
import json
import os
import time

import torch

import csd_kernels as ck


def make_chunk(rows, length, vocab, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    cond = (2 * torch.randn(rows, length, vocab, generator=g, device=device)).to(torch.bfloat16)
    uncond = (2 * torch.randn(rows, length, vocab, generator=g, device=device)).to(torch.bfloat16)
    mixed = uncond.float() + 5.0 * (cond.float() - uncond.float())
    q = torch.softmax(mixed + 0.5 * torch.randn(mixed.shape, generator=g, device=device), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(rows, length)
    return cond, uncond, q, drafts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--positions", type=int, default=1 << 20)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--rows-per-chunk", type=int, default=4096)
    parser.add_argument("--rows-per-call", type=int, default=16,
                        help="GPU calls see this many rows (16 x L = 256 positions: the split path on an H100/H200)")
    parser.add_argument("--cpu", action="store_true", help="include the C++ CPU backend (inputs copied to the host)")
    parser.add_argument("--device", default="cuda", help="cpu: a stand-in run (the torch reference is a backend)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    # on a GPU the torch reference is too slow for 2^20 positions; on the CPU it is the other side of the comparison
    backends = [b for b in ck.available_backends(device) if b != "torch" or device.type == "cpu"]
    backends += ["cuda-split"] if "cuda" in backends else []  # the CUDA backend with CSD_KERNELS_CUDA_SPLIT=1
    if args.cpu and "cpu" not in backends:
        backends.append("cpu")
    length, vocab = args.length, args.vocab
    chunks = -(-args.positions // (args.rows_per_chunk * length))
    variants = [dict(coupling=n, top_k=k) for n in ("independent", "maximal", "gumbel") for k in (None, 64)]
    pairs = [(a, b) for i, a in enumerate(backends) for b in backends[i + 1:]]
    diff_pos = {f"{a}-{b}": 0 for a, b in pairs}
    diff_rows = {f"{a}-{b}": 0 for a, b in pairs}
    positions = rows = 0
    begin = time.time()
    for c in range(chunks):
        cond, uncond, q, drafts = make_chunk(args.rows_per_chunk, length, vocab, seed=c, device=device)
        # one seed per row: a row's streams do not depend on which call (or batch position) verifies it
        seeds = torch.arange(args.rows_per_chunk, device=device) + 1_000_000 * c
        kwargs = dict(cfg_scale=5.0, rule="csd", offset=c, return_probs=False, **variants[c % len(variants)])
        out = {}
        for name in backends:
            if name == "cpu":
                host = [t.cpu() for t in (cond, drafts, q, uncond, seeds)]
                r = ck.verify(host[0], host[1], host[2], uncond_logits=host[3], seed=host[4], backend="cpu", **kwargs)
                out[name] = (r.tokens, r.accept_len)
                continue
            tokens, accept_len = [], []
            os.environ["CSD_KERNELS_CUDA_SPLIT"] = "1" if name == "cuda-split" else "0"
            for r0 in range(0, args.rows_per_chunk, args.rows_per_call):
                rows_ = slice(r0, r0 + args.rows_per_call)
                r = ck.verify(cond[rows_], drafts[rows_], q[rows_], uncond_logits=uncond[rows_], seed=seeds[rows_],
                              backend="cuda" if name == "cuda-split" else name, validate=False, **kwargs)
                tokens.append(r.tokens)
                accept_len.append(r.accept_len)
            out[name] = (torch.cat(tokens).cpu(), torch.cat(accept_len).cpu())
        for a, b in pairs:
            ta, la = out[a]
            tb, lb = out[b]
            diff_pos[f"{a}-{b}"] += int((ta != tb).sum())
            diff_rows[f"{a}-{b}"] += int(((ta != tb).any(-1) | (la != lb)).sum())
        positions += args.rows_per_chunk * length
        rows += args.rows_per_chunk
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    summary = {"device": device_name, "vocab": vocab, "length": length, "positions": positions,
               "rows": rows, "differing_positions": diff_pos, "differing_rows": diff_rows,
               "seconds": round(time.time() - begin, 1)}
    for key in diff_pos:
        print(f"{key:>14}: {diff_pos[key]} of {positions} positions differ ({diff_pos[key] / positions:.2e}), "
              f"{diff_rows[key]} of {rows} rows ({diff_rows[key] / rows:.2e})")
    print(json.dumps(summary))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"agreement_V{vocab}.json"), "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
