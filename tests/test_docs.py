"""The README and docs/ cannot drift from the code: every code block marked ``<!-- docs-test: run -->`` (on the line
before its fence) runs as written, in a scratch folder, with the ``csd`` command of this checkout; every relative
link and anchor points at something that exists.

Only blocks that run on a CPU in seconds without downloads are marked (the op example, the digits commands and
Python); GPU and real-checkpoint blocks are left unmarked and never run here.
"""

from __future__ import annotations

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
