"""The decoding loop on a GPU: correctness and speed of ``generate(static=True)`` against today's loop.

    python benchmarks/gpu_loop.py tokens [--out DIR]     CUDA vs CPU tokens on the tiny fixtures
    python benchmarks/gpu_loop.py syncs  [--out DIR]     host syncs per iteration (torch.cuda.set_sync_debug_mode)
    python benchmarks/gpu_loop.py speed  [--out DIR]     wall time at real shapes, random bf16 weights
    python benchmarks/gpu_loop.py all --device cpu --tiny   a dry run of every stage on the CPU (tiny models)

Stages (benchmarks/gpu_check.sh runs each under ``timeout``; results are printed as they come and written to
DIR/gpu_loop_<stage>.json after every case, so a timed-out stage still leaves what it measured). ``--budget S``:
no case is started once the stage has run S seconds (the rest is listed as not run), so a stage sized under its
``timeout`` ends on its own with what it measured, most telling cases first. ``--fixtures`` / ``--modes`` /
``--temperatures`` narrow tokens, ``--models`` / ``--batches`` / ``--modes`` / ``--loops`` narrow speed.

* tokens: the tiny ImageGPT / Janus / Lumina-mGPT / LlamaGen fixtures of tests/, greedy in every mode with the eager,
  static and static + CUDA-graph loops on the device against the eager loop on the CPU (must be equal), and sampled
  (T = 1) with the torch backend on both sides (equal unless the devices' float rounding flips a draw: reported).
* syncs: host syncs per iteration of each loop under ``torch.cuda.set_sync_debug_mode("warn")`` (the static loop:
  inside the iterations, and in the lagged flag read).
* speed: a Janus-Pro-7B-shaped Janus (30 layers, hidden 4096, 576 tokens, random bf16 weights), the digits model
  (its shipped weights) and LlamaGen GPT-L c2i 24 x 24 (random bf16 weights), in that order; per model and batch
  (B = 1 and 8) the loops static + graph / static / eager (in that order), each with ar and the speculative modes
  (ar first: the baseline every target divides by): first-call seconds (Triton specialisations and graph capture
  included), then a second call timed (unless the first took over SLOW_FIRST_CALL_S: then the first is reported):
  seconds per image and per iteration, and the GPU-busy fraction (kernel time / wall, from torch.profiler's CUDA
  activity). Random weights make pass counts meaningless; per-iteration cost is what they measure.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from typing import Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]

MODES_ALL = ("ar", "jd", "sjd", "gsd", "csd")
LOOPS = {"eager": dict(), "static": dict(static=True, cuda_graph=False), "static+graph": dict(static=True,
                                                                                             cuda_graph=True)}


def _loops(device: torch.device) -> dict:
    return {k: v for k, v in LOOPS.items() if device.type == "cuda" or not v.get("cuda_graph")}


class Budget:
    """Whether a stage may start another case: not once it has run ``seconds`` (None: no limit)."""

    def __init__(self, seconds: Optional[float]):
        self.seconds, self.begin, self.skipped = seconds, time.perf_counter(), []

    def allows(self, case: str) -> bool:
        if self.seconds is None or time.perf_counter() - self.begin < self.seconds:
            return True
        self.skipped.append(case)
        return False

    def report(self, stage: str, results: list, out_dir) -> None:
        """Lists the cases not run in the log and, as {"not_run": case} rows, in the stage's JSON."""
        if self.skipped:
            print(f"{stage}: budget of {self.seconds:g} s spent, {len(self.skipped)} cases not run: "
                  f"{', '.join(self.skipped[:6])}{' ...' if len(self.skipped) > 6 else ''}", flush=True)
            _save(out_dir, stage, results + [dict(not_run=case) for case in self.skipped])


def _save(out_dir, stage: str, results) -> None:
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"gpu_loop_{stage}.json"), "w") as f:
            json.dump(results, f, indent=1)


# ----------------------------------------------------------------------------------------------------------------------
# tiny fixtures (the tests' models)
# ----------------------------------------------------------------------------------------------------------------------
def tiny_fixtures() -> dict:
    """name -> (adapter factory on a device, prompt kwargs, cfg_scale, window)."""
    import conftest
    import llamagen_tiny as tiny

    from csd_kernels.models import ImageGPT, JanusAdapter, LlamaGenAdapter, LuminaMGPT
    from csd_kernels.models.llamagen.gpt import ModelArgs, Transformer

    lm = conftest.build_tiny_llama(24, seed=0, init=0.5)
    janus = conftest.build_tiny_janus()
    chameleon = conftest.build_tiny_chameleon()
    gpt = Transformer(ModelArgs(**tiny.GPT_CONFIGS["c2i"]))
    gpt.load_state_dict(tiny.seeded_state_dict({k: v.shape for k, v in gpt.state_dict().items()}))
    gpt.eval()
    return {
        "image_gpt": (lambda d: ImageGPT(copy.deepcopy(lm).to(d), image_token_range=(0, 16), grid=(4, 5),
                                         null_token_id=23), dict(input_ids=torch.tensor([[16], [17]])), 2.0),
        "janus": (lambda d: JanusAdapter(copy.deepcopy(janus).to(d)),
                  dict(input_ids=torch.tensor([[conftest.JANUS_BOS, 5, 6, conftest.JANUS_BOI]])), 3.0),
        "lumina": (lambda d: LuminaMGPT(copy.deepcopy(chameleon).to(d), **conftest.LUMINA_KW),
                   dict(input_ids=torch.tensor([[1, 5, 6]])), 3.0),
        "llamagen": (lambda d: LlamaGenAdapter(copy.deepcopy(gpt).to(d)), dict(input_ids=torch.tensor([[3], [7]])),
                     4.0),
    }


def stage_tokens(device: torch.device, out_dir, fixtures=None, modes=MODES_ALL, temperatures=(0.0, 1.0),
                 budget: Optional[float] = None) -> bool:
    from csd_kernels import generate

    cpu = torch.device("cpu")
    results, ok, clock = [], True, Budget(budget)
    chosen = {name: fixture for name, fixture in tiny_fixtures().items() if not fixtures or name in fixtures}
    adapters = {name: (make(cpu), make(device)) for name, (make, _, _) in chosen.items()}
    for temperature in temperatures:  # greedy (must be equal) of every fixture before the sampled comparisons
        for name, (_, prompt, cfg) in chosen.items():
            on_cpu, on_device = adapters[name]
            dev_prompt = {k: v.to(device) for k, v in prompt.items()}
            for mode in modes:
                if not clock.allows(f"{name}/{mode}/T={temperature:g}"):
                    continue
                backend = None if temperature == 0 else "torch"  # sampled: the same backend on both sides
                kw = dict(mode=mode, window=5, cfg_scale=cfg, temperature=temperature, seed=3, backend=backend)
                want = generate(on_cpu, **prompt, **kw).tokens
                for loop, extra in _loops(device).items():
                    got = generate(on_device, **dev_prompt, **kw, **extra).tokens.cpu()
                    agree = float((got == want).float().mean())
                    results.append(dict(model=name, mode=mode, temperature=temperature, loop=loop, agree=agree))
                    if temperature == 0 and agree < 1:
                        ok = False
                    flag = "" if agree == 1 else ("  MISMATCH" if temperature == 0 else "  (sampled: rounding)")
                    print(f"tokens {name:9s} {mode:4s} T={temperature:g} {loop:13s} agree {agree:.3f}{flag}",
                          flush=True)
                _save(out_dir, "tokens", results)
    clock.report("tokens", results, out_dir)
    print("tokens:", "GREEDY MISMATCH" if not ok else "greedy equal in every case run" if clock.skipped else
          "greedy equal everywhere")
    return ok


# ----------------------------------------------------------------------------------------------------------------------
# syncs
# ----------------------------------------------------------------------------------------------------------------------
class _SyncLog:
    """Counts synchronising CUDA calls (torch.cuda.set_sync_debug_mode warnings) inside a ``with`` block."""

    def __init__(self, device: torch.device):
        self.device, self.count = device, 0

    def __enter__(self):
        self._catch = warnings.catch_warnings(record=True)
        self._records = self._catch.__enter__()
        warnings.simplefilter("always")
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
        self.count = sum("synchroniz" in str(w.message).lower() for w in self._records)
        self._catch.__exit__(*exc)


def stage_syncs(device: torch.device, out_dir) -> bool:
    from csd_kernels import generate
    from csd_kernels.decoding.static import StaticLoop

    make, prompt, cfg = tiny_fixtures()["janus"]
    adapter, prompt = make(device), {k: v.to(device) for k, v in prompt.items()}
    results = {}
    for mode in ("ar", "csd"):
        kw = dict(mode=mode, window=4, cfg_scale=cfg, seed=1)
        generate(adapter, **prompt, **kw)  # warm-up: Triton specialisations
        with _SyncLog(device) as log:
            out = generate(adapter, **prompt, **kw)
        results[f"{mode}/eager"] = dict(syncs_per_iteration=log.count / out.forward_passes)
        for loop, extra in _loops(device).items():
            if loop == "eager":
                continue
            counts = {"inside": 0, "lagged": 0, "iterations": 0}
            original = StaticLoop.run

            def run(self, bar=None):
                self.step()  # the first iteration (and the capture, for a graph) outside the count
                self.step()
                while True:
                    with _SyncLog(device) as inside:
                        self._graph.replay() if self._graph is not None else self._step()
                        self.iterations += 1
                        self._push()
                    with _SyncLog(device) as lagged:
                        flags = self.lagged_flags()
                    counts["inside"] += inside.count
                    counts["lagged"] += lagged.count
                    counts["iterations"] += 1
                    if (flags is not None and flags[0] >= self.settings.total) or counts["iterations"] > 4 * 16:
                        break

            StaticLoop.run = run
            try:
                generate(adapter, **prompt, **kw, **extra)
            finally:
                StaticLoop.run = original
            n = max(counts["iterations"], 1)
            results[f"{mode}/{loop}"] = dict(syncs_per_iteration=counts["inside"] / n,
                                             lagged_read_syncs_per_iteration=counts["lagged"] / n)
        for key in [k for k in results if k.startswith(mode)]:
            print(f"syncs {key:18s} {results[key]}", flush=True)
        _save(out_dir, "syncs", results)
    return all(v["syncs_per_iteration"] == 0 for k, v in results.items() if "static" in k)


# ----------------------------------------------------------------------------------------------------------------------
# speed at real shapes
# ----------------------------------------------------------------------------------------------------------------------
def _busy_fraction(prof, wall: float) -> float:
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages() if e.self_device_time_total > 0)
    return kernel_us * 1e-6 / wall


def _timed(fn, device: torch.device, profile: bool):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    if profile and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - begin
        return out, wall, _busy_fraction(prof, wall)
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - begin, float("nan")


def real_models(device: torch.device, tiny: bool) -> dict:
    """name -> (adapter factory, prompt(batch) -> input_ids, cfg_scale, sampling defaults), most telling first."""
    import loop_shapes

    from csd_kernels.models import JanusAdapter

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if tiny:  # a dry run: the tests' fixtures
        fixtures = tiny_fixtures()
        return {name: (lambda f=make: f(device), lambda b, p=prompt: p["input_ids"][:1].expand(b, -1), cfg, {})
                for name, (make, prompt, cfg) in fixtures.items() if name in ("llamagen", "janus")}

    def digits():
        from csd_kernels import zoo

        return zoo.load("digits", device=device).model

    from csd_kernels.zoo.digits import DEFAULT_CFG, prompt_ids

    return {
        # the target "a W = 16 speculative iteration <= 1.2x a graph-captured ar step" is set at this shape
        "janus_pro_7b_shape": (lambda: JanusAdapter(loop_shapes.janus_pro_7b(device, dtype)), loop_shapes.janus_prompt,
                               5.0, {}),
        # the shipped weights (float32): the target "csd's seconds per image <= 1/3 of graph-captured ar's"
        "digits": (digits, lambda b: prompt_ids([i % 10 for i in range(b)]), DEFAULT_CFG, {}),
        "llamagen_gpt_l_c2i_24x24": (lambda: loop_shapes.llamagen_gpt_l(device, dtype), loop_shapes.llamagen_prompt,
                                     4.0, {}),
    }


SLOW_FIRST_CALL_S = 8.0  # a first call this slow is not repeated: its time (Triton compiles included) is reported


def stage_speed(device: torch.device, out_dir, tiny: bool, batches: list[int], modes: list[str],
                 models: Optional[list[str]] = None, loops: Optional[list[str]] = None,
                 budget: Optional[float] = None) -> bool:
    from csd_kernels import generate

    results, clock = [], Budget(budget)
    order = dict(reversed(list(_loops(device).items())))  # static+graph first: the figures that matter most
    chosen = {k: v for k, v in order.items() if not loops or k in loops}
    for name, (make_adapter, make_prompt, cfg, defaults) in real_models(device, tiny).items():
        if (models and name not in models) or not clock.allows(f"{name} (every case)"):
            continue
        adapter = make_adapter()
        for batch in batches:
            ids = make_prompt(batch).to(device)
            for loop, extra in chosen.items():
                for mode in modes:
                    if not clock.allows(f"{name}/B={batch}/{loop}/{mode}"):
                        continue
                    kw = dict(defaults, mode=mode, window=16, cfg_scale=cfg, temperature=1.0, seed=0, **extra)

                    def call():
                        return generate(adapter, ids, **kw)

                    out, first, busy = _timed(call, device, profile=False)
                    wall, timed = first, "first"
                    if first < SLOW_FIRST_CALL_S:
                        (out, wall, busy), timed = _timed(call, device, profile=True), "second"
                    row = dict(model=name, batch=batch, mode=mode, loop=loop, first_call_s=first, timed_call=timed,
                               s_per_image=wall / batch, ms_per_iteration=1e3 * wall / out.forward_passes,
                               passes=out.forward_passes, gpu_busy=busy)
                    results.append(row)
                    print(f"speed {name} B={batch} {mode:4s} {loop:13s} first {first:6.2f} s  "
                          f"{wall / batch:7.3f} s/image  {1e3 * wall / out.forward_passes:7.2f} ms/iteration  "
                          f"{out.forward_passes:4d} passes  GPU busy {busy:.2f}  ({timed} call)", flush=True)
                    _save(out_dir, "speed", results)
        adapter = None  # free the model before the next one is built
        if device.type == "cuda":
            torch.cuda.empty_cache()
    clock.report("speed", results, out_dir)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("tokens", "syncs", "speed", "all"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="speed on the tests' tiny models (a CPU dry run)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--modes", default=None,
                        help="comma-separated; tokens: every mode, speed: ar,csd,sjd (ar first: the baseline every "
                             "target divides by)")
    parser.add_argument("--models", default=None, help="speed: a comma-separated subset of the models")
    parser.add_argument("--loops", default=None, help="speed: a comma-separated subset of " + ",".join(LOOPS))
    parser.add_argument("--fixtures", default=None, help="tokens: a comma-separated subset of the tiny fixtures")
    parser.add_argument("--temperatures", default="0,1", help="tokens: 0 (greedy: must be equal) and/or 1")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per stage after which no further case is started")
    parser.add_argument("--out", default=None, help="folder for gpu_loop_<stage>.json")
    args = parser.parse_args()
    split = lambda text: text.split(",") if text else None  # noqa: E731
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --device cpu --tiny for a dry run)")
    ok = True
    if args.stage in ("tokens", "all"):
        ok &= stage_tokens(device, args.out, split(args.fixtures), split(args.modes) or MODES_ALL,
                           [float(t) for t in args.temperatures.split(",")], args.budget)
    if args.stage in ("syncs", "all"):
        ok &= stage_syncs(device, args.out)
    if args.stage in ("speed", "all"):
        ok &= stage_speed(device, args.out, args.tiny, [int(b) for b in args.batches.split(",")],
                          split(args.modes) or ["ar", "csd", "sjd"], split(args.models), split(args.loops),
                          args.budget)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
