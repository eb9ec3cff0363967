"""Device time of one verify call on the GPU, launch gaps removed: CUDA-graph replays, cold L2.

    python benchmarks/gpu_timing.py [--out DIR] [--sweep] [--vocabs 16384,8192] [--batches 1,4,16,64]
    python benchmarks/gpu_timing.py --device cpu --vocabs 64 --batches 1 --span-mb 1   (a CPU stand-in: the same
                                    calls timed by the wall clock, no graph)

Each measurement captures one graph that calls the op once on each of K input sets (K sets span > 200 MB, so
every call reads HBM, not the 60 MB L2), replays it, and divides by K. "read once" is the same graph around
torch.sum of the three input tensors (the floor of bench/op.py); "HBM floor" is the input bytes over 4.3 TB/s (a
device-to-device copy measured on an H200 of this workplace). Targets (issue 9): <= 1.5x read-once at B = 16,
<= 5 us at B = 1, L = 16, V = 16384. ``--sweep`` also times every Triton plan (register, split at each slice size)
at V = 16384 to check the launcher's choice.
"""

import argparse
import json
import os
import time

import torch

import csd_kernels as ck
from csd_kernels.backends.triton import verify as tv
from csd_kernels.bench.op import make_inputs

HBM_BYTES_PER_S = 4.3e12


def graph_time(fn, sets, replays=20):
    """Median over 5 timings of the mean device seconds per fn(set) in a graph of len(sets) calls (CPU tensors: wall
    seconds per call, no graph)."""
    if sets[0][0].device.type == "cpu":
        return wall_time(fn, sets)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for s in sets[:2]:
            fn(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for s in sets:
            fn(s)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / replays / len(sets))
    samples.sort()
    return samples[len(samples) // 2]


def wall_time(fn, sets):
    samples = []
    for _ in range(5):
        begin = time.perf_counter()
        for s in sets:
            fn(s)
        samples.append((time.perf_counter() - begin) / len(sets))
    return sorted(samples)[2]


def input_sets(batch, length, vocab, device="cuda", span=200_000_000):
    """K input sets spanning > ``span`` bytes (cold L2 on the GPU), and the bytes of one set."""
    nbytes = batch * length * vocab * (2 + 2 + 4)
    k = min(128, max(1, -(-int(span) // nbytes)))
    base = [make_inputs(batch, length, vocab, device, seed=s) for s in range(min(k, 4))]
    return base + [tuple(t.clone() for t in base[s % len(base)]) for s in range(len(base), k)], nbytes


def verify_call(backend, probs, seed, offset):
    """One call of ``backend`` ('cuda-split': the CUDA backend with CSD_KERNELS_CUDA_SPLIT=1)."""
    name = "cuda" if backend == "cuda-split" else backend

    def call(s):
        cond, uncond, q, drafts = s
        os.environ["CSD_KERNELS_CUDA_SPLIT"] = "1" if backend == "cuda-split" else "0"
        ck.verify(cond, drafts, q, uncond_logits=uncond, cfg_scale=5.0, rule="csd", seed=seed, offset=offset,
                  return_probs=probs, backend=name, validate=False)
    return call


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--backends", nargs="*", default=None)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--vocabs", default="16384,8192")
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--span-mb", type=float, default=200.0, help="bytes the input sets of one graph span")
    parser.add_argument("--device", default="cuda", help="cpu: a stand-in run (wall clock, no graph)")
    args = parser.parse_args()
    device = torch.device(args.device)
    backends = args.backends or [b for b in ck.available_backends(device) if b != "torch" or device.type == "cpu"]
    backends += ["cuda-split"] if "cuda" in backends and not args.backends else []
    seed, offset = torch.tensor([7], device=device), torch.tensor([0], device=device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"device": name, "rows": [], "sweep": []}
    sizes = dict(batches=[int(b) for b in args.batches.split(",")], device=device, span=args.span_mb * 1e6)

    def save():
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "gpu_timing.json"), "w") as f:
                json.dump(result, f, indent=1)

    for i, vocab in enumerate(int(v) for v in args.vocabs.split(",")):
        time_backends(vocab, backends, seed, offset, result["rows"], save, **sizes)
        if i == 0 and args.sweep and "triton" in backends:
            sweep_triton_plans(seed, offset, result["sweep"], save, **sizes)


def time_backends(vocab, backends, seed, offset, rows, save, batches, device, span):
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    for batch in batches:
        length = 16
        sets, nbytes = input_sets(batch, length, vocab, device, span)
        read_once = graph_time(lambda s: (s[0].sum(), s[1].sum(), s[2].sum()), sets)
        floor = nbytes / HBM_BYTES_PER_S
        plan = tv.plan(batch * length, vocab, False, sm_count)
        for backend in backends:
            for probs in (False, True):
                t = graph_time(verify_call(backend, probs, seed, offset), sets)
                rows.append(dict(backend=backend, batch=batch, length=length, vocab=vocab, probs=probs, us=t * 1e6,
                                 read_once_us=read_once * 1e6, hbm_floor_us=floor * 1e6, vs_read_once=t / read_once,
                                 vs_floor=t / floor, triton_plan=f"{plan.path}/{plan.block}"))
                save()
                print(f"{backend:>10} B={batch:<3} L={length} V={vocab:<6} probs={int(probs)}  {t * 1e6:8.2f} us   "
                      f"read-once {read_once * 1e6:7.2f} us ({t / read_once:5.2f}x)   HBM floor "
                      f"{floor * 1e6:6.2f} us ({t / floor:5.1f}x)   [triton plan {plan.path}/{plan.block}]", flush=True)
        del sets


def sweep_triton_plans(seed, offset, sweep, save, batches, device, span):
    """Every Triton plan at V = 16384: is the launcher's choice the fastest?"""
    original = tv.plan
    for batch in batches:
        sets, _ = input_sets(batch, 16, 16384, device, span)
        plans = [tv.Plan("register", 16384, 16)]
        plans += [tv.Plan("split", b, 4 if b <= 2048 else 8) for b in (512, 1024, 2048, 4096)]
        for chosen in plans:
            tv.plan = lambda *a, chosen=chosen: chosen
            try:
                t = graph_time(verify_call("triton", False, seed, offset), sets)
            finally:
                tv.plan = original
            sweep.append(dict(batch=batch, path=chosen.path, block=chosen.block, us=t * 1e6))
            save()
            print(f" sweep B={batch:<3} L=16 V=16384 {chosen.path:>8}/{chosen.block:<5} {t * 1e6:8.2f} us", flush=True)
        del sets


if __name__ == "__main__":
    main()
