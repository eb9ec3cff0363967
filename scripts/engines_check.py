"""The adapters inside the real installed engines (run by scripts/engines_check.sh in the engines' venv; not CI).

    python scripts/engines_check.py --tests SDIST_DIR [--out TABLE.md] [--timeout S]

1. ``inspect.signature`` of every vLLM adapter against the installed engine's function (names, order, kinds,
   defaults); 2. the plugin loaded through vLLM's own loader in a process that imported vLLM first (every module that
   looks the name up rebound), and a bad CSD_KERNELS_VLLM value refused in one line; 3. vLLM's test files for both
   samplers from the matching sdist, each run twice on this CPU with the same shims (scripts/engines_check_shims.py):
   vLLM's own function (the baseline) and ours swapped in. A test that fails with ours is classified: "CPU artefact"
   when it fails in the baseline too, "never reaches ours" when no call reached our adapters, else "ours" (read the
   message: a fault of ours, or a test of vLLM's exact tokens, whose random stream ours does not reproduce).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST_FILES = {  # vLLM's tests of both samplers: (file, whether it needs the CUDA shims)
    "tests/v1/sample/test_rejection_sampler.py": False,
    "tests/v1/spec_decode/test_rejection_sampler_utils.py": True,
    "tests/v1/worker/test_gpu_rejection_sampler_i64.py": True,
}
PLUGIN_PROBE = """
import importlib, os
from csd_kernels.integrations import vllm as v1, vllm_mrv2
names = (v1.V1_MODULE,) + vllm_mrv2.MRV2_MODULES
originals = {n: importlib.import_module(n).rejection_sample for n in names}  # vLLM imported before the plugin
from vllm.plugins import load_general_plugins
load_general_plugins()
for n in names:
    f = importlib.import_module(n).rejection_sample
    print(n, 'rebound' if getattr(f, 'csd_kernels_original', None) is originals[n] else 'NOT rebound')
"""


def signatures() -> list:
    from csd_kernels.integrations import vllm as v1
    from csd_kernels.integrations import vllm_mrv2

    rows = []
    for ours, theirs in ((v1.rejection_sample, "vllm.v1.sample.rejection_sampler"),
                         (vllm_mrv2.rejection_sample, "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")):
        engine = importlib.import_module(theirs).rejection_sample
        want = [(p.name, p.kind, p.default) for p in inspect.signature(engine).parameters.values()]
        have = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()][:len(want)]
        rows.append((f"signature of {theirs}.rejection_sample ({len(want)} parameters)",
                     "equal" if have == want else f"DIFFERS: ours {have} vs {want}"))
    return rows


def sglang_signature(wheel: Path) -> list:
    """SGLang's wrapper read from its wheel by AST (importing SGLang needs its CUDA stack): names, order, defaults."""
    import ast
    import zipfile

    from csd_kernels.integrations import sglang

    path = "sglang/kernels/ops/speculative/sampling.py"
    tree = ast.parse(zipfile.ZipFile(wheel).read(path))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.name == "tree_speculative_sampling_target_only")
    names = [a.arg for a in node.args.args]
    defaults = [inspect.Parameter.empty] * (len(names) - len(node.args.defaults)) + \
        [ast.literal_eval(d) for d in node.args.defaults]
    want = [(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, d) for n, d in zip(names, defaults)]
    params = inspect.signature(sglang.tree_speculative_sampling_target_only).parameters.values()
    have = [(p.name, p.kind, p.default) for p in params][:len(want)]
    return [(f"signature of {wheel.name}: {path} ({len(want)} parameters)",
             "equal" if have == want else f"DIFFERS: ours {have} vs {want}")]


def plugin() -> list:
    env = dict(os.environ, CSD_KERNELS_VLLM="strict")
    run = subprocess.run([sys.executable, "-c", PLUGIN_PROBE], env=env, capture_output=True, text=True)
    rows = [(f"plugin via vllm.plugins.load_general_plugins: {line.split()[0]}", line.split(None, 1)[1])
            for line in run.stdout.splitlines() if line.strip()]
    if run.returncode:
        rows.append(("plugin probe", f"FAILED: {run.stderr.strip().splitlines()[-1]}"))
    env["CSD_KERNELS_VLLM"] = "no-such-rule"
    bad = subprocess.run([sys.executable, "-c", "from vllm.plugins import load_general_plugins as l; l()"], env=env,
                         capture_output=True, text=True)
    last = (bad.stderr.strip().splitlines() or [""])[-1]
    rows.append(("CSD_KERNELS_VLLM=no-such-rule at plugin load",
                 f"refused: {last}" if bad.returncode and last.startswith("ValueError") else f"NOT refused: {last}"))
    return rows


def run_tests(sdist: Path, path: str, cuda_shim: bool, swap: bool, timeout: int) -> dict:
    """{test id: (outcome, message, csd calls)} from one pytest run of vLLM's file."""
    xml = Path(os.environ.get("TMPDIR", "/tmp")) / f"engines_{Path(path).stem}_{'ours' if swap else 'vllm'}.xml"
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{sdist}", CSD_SHIM_CUDA="1" if cuda_shim else "0",
               CSD_SWAP="vllm" if swap else "", CSD_KERNELS_VLLM="strict" if swap else "0", TRITON_INTERPRET="1")
    # --noconftest: vLLM's tests/conftest.py needs its test extras (tblib, ...); these files use none of its fixtures
    command = [sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "engines_check_shims",
               "-p", "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_family=xunit1", path]
    try:
        subprocess.run(command, cwd=sdist, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    if not xml.exists():
        return {}
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        calls = next((int(p.get("value")) for p in case.iter("property") if p.get("name") == "csd_calls"), 0)
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            results[test] = ("failed", (bad.get("message") or "").splitlines()[0][:160], calls)
        elif case.find("skipped") is not None:
            results[test] = ("skipped", (case.find("skipped").get("message") or "")[:160], calls)
        else:
            results[test] = ("passed", "", calls)
    xml.unlink()
    return results


def classify(test: str, ours: tuple, baseline: dict) -> str:
    if ours[0] != "failed":
        return ours[0]
    if baseline.get(test, ("missing",))[0] == "failed":
        return "CPU artefact (fails with vLLM's own function too)"
    return "never reaches ours" if ours[2] == 0 else "ours"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, required=True, help="the unpacked vLLM sdist (its tests/)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per pytest run")
    parser.add_argument("--sglang-wheel", type=Path, default=None, help="SGLang's wheel, for its signature")
    parser.add_argument("--only", default=None, help="run only the test files containing this string")
    args = parser.parse_args()
    import torch
    import vllm

    lines = [f"vllm {vllm.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             "| check | result |", "|---|---|"]
    rows = signatures() + (sglang_signature(args.sglang_wheel) if args.sglang_wheel else []) + plugin()
    lines += [f"| {a} | {b} |" for a, b in rows]
    details = []
    for path, cuda_shim in TEST_FILES.items():
        if args.only and args.only not in path:
            continue
        baseline = run_tests(args.tests, path, cuda_shim, False, args.timeout)
        ours = run_tests(args.tests, path, cuda_shim, True, args.timeout)
        verdicts = {test: classify(test, result, baseline) for test, result in ours.items()}
        count = {v: sum(1 for x in verdicts.values() if x == v) for v in set(verdicts.values())}
        base_passed = sum(1 for r in baseline.values() if r[0] == "passed")
        lines.append(f"| `{args.tests.name}/{path}` ({'CUDA shims, ' if cuda_shim else ''}{len(ours)} tests) | ours: "
                     + ", ".join(f"{n} {v}" for v, n in sorted(count.items()))
                     + f"; vLLM's own on this CPU: {base_passed} passed of {len(baseline)} |")
        details += [f"- `{test}`: {verdict}; calls to ours {ours[test][2]}; {ours[test][1]}"
                    for test, verdict in sorted(verdicts.items()) if verdict not in ("passed", "skipped")]
    text = "\n".join(lines + ["", "Failures with ours:", ""] + (details or ["- none"])) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
