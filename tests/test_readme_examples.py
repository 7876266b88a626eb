"""README.md is for users: its Python examples run (twice in a row, leaving nothing behind) and print what
the README says they print; it links only to files inside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# a ```python block, optionally followed by "prints" and a ```text block with its exact output
_EXAMPLE = re.compile(r"```python\n(?P<code>.*?)```\n(?:\s*prints\s*\n+```text\n(?P<output>.*?)```)?", re.S)
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _examples() -> list[tuple[str, str | None]]:
    return [(m["code"], m["output"]) for m in _EXAMPLE.finditer(README.read_text())]


def test_the_readme_has_examples_with_their_output() -> None:
    examples = _examples()
    assert len(examples) >= 2
    assert all(output for _, output in examples), "every example shows what it prints"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", range(len(_examples())))
def test_a_readme_example_runs_twice_and_prints_what_the_readme_says(index: int, tmp_path: Path) -> None:
    code, output = _examples()[index]
    driver_dir, scratch = tmp_path / "driver", tmp_path / "tmp"
    scratch.mkdir()
    env = dict(
        os.environ,
        LOGBUF_DIR=str(driver_dir),  # its own driver directory (created by the driver, not by us)
        TMPDIR=str(scratch),  # its own temporary files
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    for run in (1, 2):  # the second run meets whatever the first one left behind
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, f"run {run}:\n{done.stderr}"
        assert done.stdout == output, f"run {run}"
        assert list(scratch.iterdir()) == [], f"run {run} left temporary files"
        left = [p for p in driver_dir.rglob("*") if p.is_file()] if driver_dir.exists() else []
        assert left == [], f"run {run} left driver files"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_stay_inside_the_repository(doc: Path) -> None:
    text = doc.read_text()
    for match in _LINK.finditer(text):
        target = match["target"].split("#", 1)[0]
        assert not re.match(r"[a-z]+:", target), f"{doc.name}: external link {target}"
        assert (doc.parent / target).resolve().is_relative_to(ROOT), f"{doc.name}: {target} leaves the repository"
        assert (doc.parent / target).exists(), f"{doc.name}: {target} does not exist"
    assert "../shared" not in text and "/work/" not in text
    assert not re.search(r"\bissues? #?\d+", text, re.I), f"{doc.name} mentions an internal issue number"
