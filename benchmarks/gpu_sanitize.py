"""Small verify calls for compute-sanitizer (memcheck, racecheck, synccheck) on every GPU backend.

    compute-sanitizer --tool memcheck python benchmarks/gpu_sanitize.py [--quick]
    python benchmarks/gpu_sanitize.py --quick --device cpu     (a CPU stand-in: the same calls on the CPU backends)

Covers V in {1, 7, 513, 16385, 65537} (register and chunked paths, ragged tails), top-k, gumbel and maximal next
drafts, strided CFG halves and per-row seeds/offsets. Prints one line per call; the sanitizer reports any error.
"""

import argparse
import os

import torch

import csd_kernels as ck


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true",
                        help="the split path and one per-position path, two vocabularies")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    backends = [b for b in ck.available_backends(device) if b != "torch"]
    backends += ["cuda-split"] if "cuda" in backends else []  # the CUDA backend with CSD_KERNELS_CUDA_SPLIT=1
    if not backends:
        raise SystemExit(f"no compiled backend on {device}: {ck.available_backends(device)}")
    g = torch.Generator().manual_seed(0)
    for vocab in (7, 16385) if args.quick else (1, 7, 513, 16385, 65537):
        batch, length = 2, 3
        both = (3 * torch.randn(2 * batch, length, vocab, generator=g)).to(torch.bfloat16).to(device)
        q = torch.softmax(torch.randn(batch, length, vocab, generator=g), -1).to(device)
        drafts = torch.randint(0, vocab, (batch, length), generator=g).to(device)
        drafts[1, -1] = -1
        for backend in backends:
            os.environ["CSD_KERNELS_CUDA_SPLIT"] = "1" if backend == "cuda-split" else "0"
            cases = (("gumbel", 5), ("maximal", None)) + ((("independent", 3),) if not args.quick else ())
            for coupling, top_k in cases:
                r = ck.verify(both[0::2], drafts, q, uncond_logits=both[1::2], cfg_scale=4.0, top_k=top_k,
                              coupling=coupling, seed=torch.tensor([3, 4], device=device),
                              offset=torch.tensor([0, 9], device=device), start=torch.tensor([0, 1], device=device),
                              backend="cuda" if backend == "cuda-split" else backend)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                print(backend, vocab, coupling, top_k, r.accept_len.tolist(), flush=True)


if __name__ == "__main__":
    main()
