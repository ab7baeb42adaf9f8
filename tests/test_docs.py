"""The documentation's Python code blocks run as written (each page's blocks in order, in one namespace, in a
temporary directory), except blocks marked ``<!-- docs-test: skip (reason) -->`` on the line before: a GPU,
the hub or a long run. A page's claims about code are then checked where they are made."""

from __future__ import annotations

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
BLOCK = re.compile(r"(<!-- docs-test: skip \((?P<why>[^)]*)\) -->\n)?```python\n(?P<code>.*?)```", re.S)
PAGES = sorted(
    os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(DOCS) for f in fs if f.endswith(".md")
) + ["README.md"]


def blocks(page: str) -> list[tuple[str, str | None]]:
    text = open(os.path.join(ROOT, page)).read()
    return [(m["code"], m["why"]) for m in BLOCK.finditer(text)]


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)])
def test_page_code_blocks_run(page, tmp_path, monkeypatch):
    runnable = [code for code, why in blocks(page) if why is None]
    if not runnable:
        pytest.skip("every block on this page is marked: " + "; ".join(w for _, w in blocks(page) if w))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [ROOT, *sys.path])  # as in the checkout's root: `recipes` imports
    namespace: dict = {"__name__": f"docs_{page}"}
    for code in runnable:
        exec(compile(code, page, "exec"), namespace)  # noqa: S102


def test_skip_markers_give_a_reason():
    for page in PAGES:
        for _, why in blocks(page):
            assert why is None or why.strip(), f"{page}: a skipped block needs a reason"
