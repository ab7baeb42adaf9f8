"""The committed MuJoCo reports regenerate from the committed runs with today's code (slow: each reads every
run of results/mujoco, ~20 s on an idle core). What the runs were made with is checked apart: the code at
each run's recorded commit is the suite commit's (test_mujoco_confirm_report's provenance test); up to
6944b5d, the last commit with the lab's own copy of the algorithms, the scripts were also checked to train
as that copy did."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile

import pytest

from rgpo_lab.results_data import Manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
# both reports read every run under results/mujoco, so every MuJoCo suite's per-step logs
MUJOCO_SUITES = tuple(sorted(s for s in Manifest.load(ROOT).suites if s.startswith("mujoco/")))


def _git(*args):
    out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True)
    if out.returncode != 0:
        pytest.skip(f"git {' '.join(args)} failed (not a full checkout?)")
    return out.stdout


def _overlay_restored_logs(snapshot: str) -> None:
    """Per-step logs that the snapshot's commit no longer tracks, copied in from the restored ones (the
    ``results_data`` marker has checked them against the manifest)."""
    for rec in Manifest.load(ROOT).suites.values():
        for p in rec.files:
            if p.startswith("mujoco/") and os.path.isdir(os.path.join(snapshot, os.path.dirname(p))):
                target = os.path.join(snapshot, p)
                if not os.path.exists(target):
                    shutil.copyfile(os.path.join(ROOT, "results", p), target)


@pytest.mark.slow
@pytest.mark.results_data(*MUJOCO_SUITES)
def test_policy_lag_confirm_report_regenerates_byte_identically(tmp_path):
    """The report as last committed, rebuilt from results/mujoco as of that commit (runs keep landing
    after it; the per-step logs it no longer tracks from their restored copies): report.md, studies.json and
    curves.png byte for byte."""
    from rgpo_lab.mujoco_report import confirm

    report = "results/mujoco/policy_lag_confirm/report"
    commit = _git("log", "-1", "--format=%H", "--", f"{report}/report.md").decode().strip()
    archive = tmp_path / "results.tar"
    archive.write_bytes(_git("archive", commit, "results/mujoco"))
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "then", filter="data")
    _overlay_restored_logs(str(tmp_path / "then" / "results"))
    confirm.build(str(tmp_path / "then" / "results" / "mujoco"), str(tmp_path / "out"))
    for name in ("report.md", "studies.json", "curves.png"):
        assert (tmp_path / "out" / name).read_bytes() == _git("show", f"{commit}:{report}/{name}"), name


@pytest.mark.slow
@pytest.mark.results_data(*MUJOCO_SUITES)
def test_main_mujoco_report_regenerates(tmp_path):
    """results/mujoco/report from today's results/mujoco: every table and figure byte for byte; in report.md
    only the command line and the status rows of suites still running (or that the committed report
    predates) may differ."""
    from rgpo_lab.mujoco_report.__main__ import main

    committed = os.path.join(ROOT, "results", "mujoco", "report")
    assert main([os.path.join(ROOT, "results", "mujoco"), "--out", str(tmp_path)]) in (None, 0)
    for name in sorted(os.listdir(committed)):
        if name != "report.md":
            assert (tmp_path / name).read_bytes() == open(os.path.join(committed, name), "rb").read(), name
    old_lines = open(os.path.join(committed, "report.md")).read().splitlines()

    def status_row(line):  # | suite | planned | finished | running | missing |
        cells = [c.strip() for c in line.split("|")[1:-1]]
        return cells if line.startswith("| ") and len(cells) == 5 and cells[1].isdigit() else None

    complete = {row[0] for line in old_lines if (row := status_row(line)) and row[4] == "0"}

    def kept(line):  # not the command, not the status row of a suite that was not complete when committed
        row = status_row(line)
        return not line.startswith("Command: ") and not (row and row[0] not in complete)

    new_lines = (tmp_path / "report.md").read_text().splitlines()
    assert [x for x in new_lines if kept(x)] == [x for x in old_lines if kept(x)]


@pytest.mark.results_data("mujoco/compile_equiv")
def test_compile_equivalence_benchmark_rebuilds(tmp_path, monkeypatch):
    """results/benchmarks/mujoco_compile_equivalence from today's results/mujoco: every number, verdict,
    missing run and commit as committed. Two things differ, both by later changes and not by data: the
    command line (the module moved into rgpo_lab/benchmarks/) and the order of the rows (the methods now run
    in the paper's table order, rgpo last), so rows are compared by (method, env) and lines as a multiset."""
    import json
    import sys
    from collections import Counter

    from rgpo_lab.benchmarks import compile_equivalence as ce

    out = tmp_path / "mujoco_compile_equivalence"
    monkeypatch.setattr(sys, "argv", ["ce", os.path.join(ROOT, "results", "mujoco"), "--out", str(out)])
    ce.main()
    committed = os.path.join(ROOT, "results", "benchmarks", "mujoco_compile_equivalence")
    new, old = (json.load(open(f"{p}.json")) for p in (out, committed))
    assert new.keys() == old.keys()
    by_cell = [{(r["method"], r["env"]): r for r in x["rows"]} for x in (new, old)]
    assert by_cell[0] == by_cell[1] and len(new["rows"]) == len(old["rows"])
    assert all(new[k] == old[k] for k in new if k not in ("rows", "command"))
    new_md, old_md = (
        Counter(x for x in open(f"{p}.md").read().splitlines() if not x.startswith("Command: "))
        for p in (out, committed)
    )
    assert new_md == old_md
