"""The README and docs/ cannot drift from the code: every code block marked ``<!-- docs-test: run -->`` (on the line
before its fence) runs as written, in a scratch folder, with the ``csd`` command of this checkout; every relative
link and anchor points at something that exists; every path of the repository (``csd_kernels/...``, ``tests/...``)
and every module name (``csd_kernels.x.y``) a page names exists.

Only blocks that run on a CPU in seconds without downloads are marked (the op example, the digits commands and
Python); GPU and real-checkpoint blocks are left unmarked and never run here.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- docs-test: run -->"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages other branches add; links to them are allowed until they land.
RUNNERS = ("python", "bash")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marked: bool

    @property
    def name(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"


def code_blocks(page: Path, text: str | None = None) -> list[Block]:
    """The fenced code blocks of a Markdown page, each with whether the line before its fence is MARK."""
    lines = (page.read_text() if text is None else text).splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = re.match(r"^(```+)\s*(\S*)", lines[index])
        if not fence:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith(fence.group(1)):
            end += 1
        before = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
        blocks.append(Block(page, index + 1, fence.group(2), "\n".join(lines[index + 1:end]) + "\n", before == MARK))
        index = end + 1
    return blocks


def run_block(block: Block, workdir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run one block in ``workdir`` as a user's shell would (no Triton interpreter), with ``csd`` and ``python`` of
    this checkout and interpreter first on the PATH."""
    bin_dir = workdir / ".bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "csd"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m csd_kernels "$@"\n')
    shim.chmod(0o755)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    command = [sys.executable, "-c", block.code] if block.language == "python" else \
        ["bash", "-euo", "pipefail", "-c", block.code]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def _check(block: Block, result: subprocess.CompletedProcess) -> None:
    if result.returncode != 0:
        pytest.fail(f"{block.name}: the {block.language} block exits with {result.returncode}\n--- block\n{block.code}"
                    f"--- stdout (tail)\n{result.stdout[-2000:]}\n--- stderr (tail)\n{result.stderr[-3000:]}")


MARKED = [block for page in PAGES for block in code_blocks(page) if block.marked]


def test_the_front_page_has_runnable_examples():
    readme = [block for block in MARKED if block.page.name == "README.md"]
    assert {block.language for block in readme} == {"python", "bash"}  # the op example and the digits commands
    assert any("ck.verify(" in block.code for block in readme)
    assert all(block.language in RUNNERS for block in MARKED), [b.name for b in MARKED if b.language not in RUNNERS]


@pytest.mark.parametrize("block", MARKED, ids=[block.name for block in MARKED])
def test_marked_block_runs(block, tmp_path):
    _check(block, run_block(block, tmp_path))


def test_a_broken_block_fails(tmp_path):
    page = tmp_path / "broken.md"
    text = f"{MARK}\n```python\nimport sys\nsys.exit(3)\n```\n\n```bash\nfalse\n```\n"
    blocks = code_blocks(page, text)
    assert [(b.language, b.marked, b.line) for b in blocks] == [("python", True, 2), ("bash", False, 7)]
    result = run_block(blocks[0], tmp_path)
    assert result.returncode != 0
    with pytest.raises(pytest.fail.Exception, match="broken.md:2: the python block exits"):
        _check(blocks[0], result)


# ---------------------------------------------------------------------------------------------------- links
def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (word characters, spaces, hyphens kept),
    spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # no headings inside code
    found: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        base = slug(heading)
        count = found.get(base, 0)
        found[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'<img [^>]*src="([^"]+)"', text)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(target)
            continue
        if anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)
        if anchor and path.is_dir() and anchor not in anchors(path / "README.md"):
            broken.append(target)
    return broken


def test_slugs_follow_github():
    assert slug("The speed–quality frontier (csd sweep)") == "the-speedquality-frontier-csd-sweep"
    assert slug("max_lead at B = 64") == "max_lead-at-b--64"
    assert slug("The op: `ck.verify`") == "the-op-ckverify"


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_links_resolve(page):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title\n\n[ok](#title) [gone](b.md) [bad anchor](#nothing)\n"
                                   '<img src="c.png">\n')
    assert broken_links(tmp_path / "a.md") == ["b.md", "#nothing", "c.png"]


# ---------------------------------------------------------------------------------------------------- named paths
PATH_ROOTS = ("csd_kernels", "csrc", "tests", "benchmarks", "scripts", "examples", "python")
# what a build or a run writes (the compiled extension, benchmark results; .gitignore): absent from a clean clone
WRITTEN = ("csd_kernels/_C*.so", "csd_kernels/_C.stamp", "csd_kernels._C", "benchmarks/results/")


def named_paths(text: str) -> list[str]:
    """Repository paths a page names (code blocks included), without a test id's ``::name`` or trailing stops;
    a pattern (``tests/test_<family>.py``) is no path."""
    found = re.findall(rf"(?<![\w./$-])((?:{'|'.join(PATH_ROOTS)})/[\w./*-]*)(<?)", text)
    return sorted({path.rstrip(".:,-") for path, pattern in found if not pattern})


def named_modules(text: str) -> list[str]:
    return sorted(set(re.findall(r"(?<![\w./-])csd_kernels(?:\.[A-Za-z_]\w*)+", text)))


def path_exists(path: str) -> bool:
    return bool(glob.glob(str(ROOT / path))) if "*" in path else (ROOT / path).exists()


def module_exists(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or a name in one (``csd_kernels.models.ImageGPT``)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        try:
            found = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a module the package imports is missing: not what this test checks
                raise
            continue
        for attribute in parts[end:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def written(name: str) -> bool:
    return any(name == pattern or pattern.endswith("/") and name.startswith(pattern) for pattern in WRITTEN)


def missing_names(page: Path) -> list[str]:
    text = page.read_text()
    return [path for path in named_paths(text) if not written(path) and not path_exists(path)] + \
        [name for name in named_modules(text) if not written(name) and not module_exists(name)]


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_named_paths_exist(page):
    assert missing_names(page) == []


def test_a_missing_path_or_module_is_found(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("See csd_kernels/ops/verify.py, tests/test_docs.py::test_slugs_follow_github, tests/test_<x>.py.\n"
                    "```\npython benchmarks/nothing.py\n```\n"
                    "Gone: csd_kernels/zoo/checkpoints.py, csd_kernels.models.NoSuchAdapter, csd_kernels.nothing.\n"
                    "Here: csd_kernels.models.registry.get_adapter, csd_kernels/backends/triton/kernels/*.py.\n"
                    "Written: csd_kernels/_C*.so, benchmarks/results/gpu.\n")
    assert missing_names(page) == ["benchmarks/nothing.py", "csd_kernels/zoo/checkpoints.py",
                                   "csd_kernels.models.NoSuchAdapter", "csd_kernels.nothing"]


def layout_names(text: str) -> list[tuple[str, str]]:
    """(root, name) for each file or folder name a layout line of a code block gives after its path
    (``csd_kernels/models/   registry.py (...), janus/``; indented lines continue the line above)."""
    text = "\n".join(block.code for block in code_blocks(Path("page.md"), text))
    found, root = [], None
    for line in text.splitlines():
        start = re.match(rf"({'|'.join(PATH_ROOTS)})/\S*\s{{2,}}", line)
        if start:
            root = start.group(1)
        elif not line.startswith(" " * 10):
            root = None
        if root:
            described = line[start.end():] if start else line
            names = re.findall(r"(?<![\w./-])([\w-]+\.(?:py|h|cuh|cpp|cu|sh)\b|[\w-]+/(?![\w.]))", described)
            found += [(root, name) for name in names]
    return found


def missing_layout_names(page: Path) -> list[str]:
    """Layout names with no file or folder of that name anywhere under their line's top-level folder."""
    return [f"{root}/.../{name}" for root, name in layout_names(page.read_text())
            if not any(path.name == name.rstrip("/") for path in (ROOT / root).rglob(name.rstrip("/")))]


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_layout_names_exist(page):
    assert missing_layout_names(page) == []


def test_a_stale_layout_line_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "csd_kernels" / "zoo" / "digits").mkdir(parents=True)
    (tmp_path / "csd_kernels" / "zoo" / "__init__.py").write_text("")
    page = tmp_path / "a.md"
    page.write_text("```\ncsd_kernels/zoo/     the models: digits/ (shipped), checkpoints.py (local),\n"
                    "                      __init__.py, gone/\nother text: nothing.py\n```\n")
    assert missing_layout_names(page) == ["csd_kernels/.../checkpoints.py", "csd_kernels/.../gone/"]


def test_the_layout_drawing_names_every_layer():
    """docs/development.md draws the layers of tests/test_imports.py's MAY_IMPORT table."""
    from test_imports import MAY_IMPORT

    text = (ROOT / "docs" / "development.md").read_text()
    drawing = code_blocks(ROOT / "docs" / "development.md", text[text.index("## Layout"):])[0].code
    packages = {name for name in MAY_IMPORT if (ROOT / "csd_kernels" / name).is_dir()}
    assert set(re.findall(r"(?<![\w./-])(\w+)/", drawing)) == packages
    modules = {name for name in MAY_IMPORT if (ROOT / "csd_kernels" / f"{name}.py").is_file()} - {"__main__"}
    assert all(f"{name}.py" in drawing for name in modules), modules
