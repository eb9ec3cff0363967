"""Microbenchmarks of the verify op: every backend against reading the inputs once and against a Python loop.

The cases are pytest-benchmark tests (:mod:`csd_kernels.bench.cases`); :func:`run` runs them and reads the JSON, and
the table, CSV and plot come from that JSON. The Python loop is the CSD authors' verification as they wrote it: loops
over batch and positions with a host sync per position, a [B, L, V] uniform tensor drawn per step of which one value
per position is used. "Read once" is a ``torch.sum`` over the same input tensors in the same run: the floor any
one-pass kernel is measured against.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass
from typing import Optional, Union

import torch

from ..fileio.outputs import Output
from ..testing import make_case
from ..text_table import text_table

JANUS_VOCAB, LUMINA_VOCAB = 16384, 8192
DEFAULT_SHAPES = [(b, 16, v) for v in (JANUS_VOCAB, LUMINA_VOCAB) for b in (1, 4, 16)]
QUICK_SHAPES = [(1, 16, JANUS_VOCAB), (4, 16, LUMINA_VOCAB)]
# The cases import this module; pytest runs them by path, so this module never imports them.
CASES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.py")


@dataclass
class BenchRow:
    backend: str
    batch: int
    length: int
    vocab: int
    return_probs: bool
    seconds: float  # median per call (pytest-benchmark)
    read_once_seconds: float
    python_loop_seconds: float

    @property
    def vs_read_once(self) -> float:
        return self.seconds / self.read_once_seconds

    @property
    def speedup_vs_loop(self) -> float:
        return self.python_loop_seconds / self.seconds


def authors_python_loop(cond, uncond, q, drafts, cfg_scale=5.0, entropy_coef=0.5, tvd_threshold=0.65, temperature=1.0):
    """The CSD authors' verification, transcribed from its description: maths in the logits' dtype (bf16 for their
    models), p and q clamped to 1e-10, a [B, L, V] uniform tensor per step, and a Python loop over rows and positions
    with host syncs for the gate and the decision."""
    logits = uncond + cfg_scale * (cond - uncond)
    p_all = torch.softmax(logits / temperature, dim=-1)
    random = torch.rand_like(p_all)
    batch, length, _ = p_all.shape
    tokens = drafts.clone()
    accept_len = []
    for b in range(batch):
        n = length
        for i in range(length):
            p, q_i = p_all[b, i].clamp(min=1e-10), q[b, i].to(p_all.dtype).clamp(min=1e-10)
            h = -(p * p.log()).sum()
            tvd = 0.5 * (p - q_i).abs().sum()
            x = int(drafts[b, i])
            ratio = p[x] / q_i[x]
            gate = tvd.item() < tvd_threshold
            a = torch.clamp(ratio + entropy_coef * h, max=1.0) if gate else torch.clamp(ratio, max=1.0)
            if random[b, i, x].item() < a.item():
                continue
            residual = (p - q_i).clamp(min=0).float()
            tokens[b, i] = torch.multinomial(residual / residual.sum(), 1)[0]
            n = i
            break
        accept_len.append(n)
    return tokens, accept_len


def make_inputs(batch, length, vocab, device, dtype=torch.bfloat16, seed=0):
    """(cond, uncond, q, drafts): a CFG batch as a model returns it (the halves of one interleaved batch) and the
    previous iteration's q, which is p of a slightly different context (testing.make_case's "jacobi" q): TVD(p, q)
    is below τ, so the CSD gate is open and most drafts (all sampled from q) are accepted — the regime in which CSD
    does its work."""
    case = make_case(batch, length, vocab, dtype=dtype, q="jacobi", strided=True, from_q=1.0, seed=seed,
                     device=device)
    return case["target_logits"], case["uncond_logits"], case["draft_probs"], case["draft_tokens"]


def run(device: str = "cpu", backends: Optional[list[str]] = None, quick: bool = False,
        json_path: Optional[str] = None, shapes: Optional[list] = None) -> list[BenchRow]:
    """Run the pytest-benchmark cases (a subprocess: pytest, pytest-benchmark and the settings in its environment)
    and return their rows; the raw pytest-benchmark JSON is kept at ``json_path`` when given."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = json_path or os.path.join(tmp, "benchmark.json")
        env = dict(os.environ, CSD_BENCH_DEVICE=str(device), CSD_BENCH_QUICK="1" if quick else "0",
                   CSD_BENCH_BACKENDS=",".join(backends or []),
                   CSD_BENCH_SHAPES=";".join(",".join(str(n) for n in shape) for shape in shapes or []))
        command = [sys.executable, "-m", "pytest", CASES_FILE, "-q", "-p", "no:cacheprovider",
                   f"--benchmark-json={path}", "--benchmark-min-rounds=5"]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"the benchmark run failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        with open(path) as f:
            return rows_from_json(json.load(f))


def rows_from_json(data: dict) -> list[BenchRow]:
    """BenchRows from a pytest-benchmark JSON of cases.py: each verify median against the read-once and
    authors'-loop medians of the same shape in the same run."""
    by_kind: dict = {}
    for case in data["benchmarks"]:
        info = case["extra_info"]
        shape = (info["batch"], info["length"], info["vocab"])
        by_kind.setdefault(info["kind"], []).append((shape, info, case["stats"]["median"]))
    read_once = {shape: t for shape, _, t in by_kind.get("read-once", [])}
    loop = {shape: t for shape, _, t in by_kind.get("authors-loop", [])}
    return [BenchRow(info["backend"], *shape, info["return_probs"], t, read_once[shape], loop[shape])
            for shape, info, t in by_kind.get("verify", [])]


def format_table(rows: list[BenchRow]) -> str:
    columns = [("backend", "<8"), ("B", ">3"), ("L", ">3"), ("V", ">6"), ("probs", ">5"), ("time", ">10"),
               ("x read-once", ">11"), ("x faster than loop", ">18")]
    return text_table(columns, ([r.backend, str(r.batch), str(r.length), str(r.vocab), str(r.return_probs),
                                 f"{r.seconds * 1e6:8.0f}µs", f"{r.vs_read_once:.2f}", f"{r.speedup_vs_loop:.1f}"]
                                for r in rows))


def save(rows: list[BenchRow], out: Union[str, Output], device_name: str) -> dict[str, str]:
    """Write verify.json, verify.csv and verify.png (time against batch, per vocabulary) into ``out``: a folder, or
    the :class:`~csd_kernels.fileio.outputs.Output` of a run that writes more files (all of them put in place
    together); returns their final paths."""
    if isinstance(out, str):
        with Output(out) as output:
            return save(rows, output, device_name)
    records = [dict(asdict(r), vs_read_once=r.vs_read_once, speedup_vs_loop=r.speedup_vs_loop) for r in rows]
    out.write_json("verify.json", {"device": device_name, "torch": torch.__version__, "rows": records})
    with open(out.path("verify.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    _plot(rows, out.path("verify.png"), device_name)
    return {name: out.final(f"verify.{name}") for name in ("json", "csv", "png")}


def _plot(rows: list[BenchRow], path: str, device_name: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(rows, device_name)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def figure(rows: list[BenchRow], device_name: str):
    """verify.png: one panel per vocabulary, µs per call against the batch, one marked line per backend (dashed:
    without probs), the read-once floor and the authors' loop; every series has markers (a panel may hold one batch)
    and the legend sits under the panels, off the points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vocabs = sorted({r.vocab for r in rows})
    fig, axes = plt.subplots(1, len(vocabs), figsize=(5 * len(vocabs), 4.6), squeeze=False)
    for ax, vocab in zip(axes[0], vocabs):
        subset = [r for r in rows if r.vocab == vocab]
        batches = sorted({r.batch for r in subset})
        for backend in sorted({r.backend for r in subset}):
            for return_probs in (True, False):
                points = sorted((r for r in subset if r.backend == backend and r.return_probs == return_probs),
                                key=lambda r: r.batch)
                if points:
                    ax.plot([r.batch for r in points], [r.seconds * 1e6 for r in points], marker="o",
                            linestyle="-" if return_probs else "--",
                            label=f"{backend}{'' if return_probs else ' (no probs)'}")
        read_once = {r.batch: r.read_once_seconds for r in subset}
        loop = {r.batch: r.python_loop_seconds for r in subset}
        ax.plot(batches, [read_once[b] * 1e6 for b in batches], color="black", linestyle=":", marker="x",
                label="read inputs once")
        ax.plot(batches, [loop[b] * 1e6 for b in batches], color="grey", linestyle="-.", marker="^",
                label="authors' Python loop")
        ax.set(xscale="log", yscale="log", xlabel="batch B (L = 16)", ylabel="µs per call",
               title=f"V = {vocab} ({device_name})")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
    legend = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
    labels = list(legend)
    fig.legend(list(legend.values()), labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    fig.tight_layout(rect=(0, 0.06 + 0.05 * ((len(labels) - 1) // 4), 1, 1))
    return fig
