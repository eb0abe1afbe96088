"""The data-driven fifo scripts in scripts/*.txt (format: script.py). Each script
names the spec passage it checks in its comments."""

from __future__ import annotations

from pathlib import Path

import pytest

from .script import REWRITE, run_script

SCRIPTS = sorted((Path(__file__).parent / "scripts").glob("*.txt"))


def test_there_are_scripts():
    assert SCRIPTS


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script(path: Path):
    results, rewritten = run_script(path)
    if REWRITE:
        path.write_text(rewritten)
        return
    for block, actual in results:
        assert actual == block.expected, (
            f"{path.name}:{block.line}: {block.command}\n"
            f"(QQ_REWRITE=1 rewrites the expected output)")
