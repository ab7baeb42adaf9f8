"""The lab (rgpo_lab) runs from a checkout, not from the installed package: its command lines say so, it runs
from elsewhere with the checkout on PYTHONPATH, and a copy of it without the checkout's scripts refuses in
one line naming the checkout root it expected."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_NOTE = "Run from the repository root of a checkout (cd <checkout> first, or PYTHONPATH=<checkout>)"


def _lab(args: list[str], cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_lab_runs_from_elsewhere_only_with_the_checkout_on_the_path(tmp_path):
    r = _lab(["rgpo_lab.rlhf_select", "--help"], tmp_path)  # what a newcomer sees outside the root
    assert r.returncode == 1 and "No module named 'rgpo_lab'" in r.stderr
    r = _lab(["rgpo_lab.rlhf_select", "--help"], tmp_path, pythonpath=str(ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    assert RUN_NOTE in " ".join(r.stdout.split())  # --help says how to run it


def test_lab_copied_without_the_checkout_refuses_in_one_line(tmp_path):
    shutil.copytree(ROOT / "rgpo_lab", tmp_path / "rgpo_lab", ignore=shutil.ignore_patterns("__pycache__"))
    r = _lab(["rgpo_lab.rlhf_suite", "--list"], tmp_path)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"rgpo_lab runs from a checkout of rgpo-trl and {tmp_path} is not one" in lines[0]
    assert (
        "recipes/hh_rlhf_qwen.py" in lines[0] and "cd <checkout> && python -m rgpo_lab.<module>" in lines[0]
    )


@pytest.mark.parametrize(
    "module", ["rgpo_lab", "rgpo_lab.rlhf_suite", "rgpo_lab.rlhf_report", "rgpo_lab.rlhf_select"]
)
def test_lab_docstrings_say_where_to_run_it(module):
    """The rlhf modules' --help is their docstring (argparse's description)."""
    doc = " ".join(importlib.import_module(module).__doc__.split())
    assert "cd <checkout>" in doc and "PYTHONPATH=<checkout>" in doc
