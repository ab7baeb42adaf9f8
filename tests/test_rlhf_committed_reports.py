"""The committed RLHF reports rebuild from the restored per-step logs with today's code (slow, and each
skipped until `make results-data` has restored the suites it reads): every table, JSON and figure byte for
byte; in report.md only what names the output folder (the command line, a relative link) may differ. World v3
(results/rlhf/v3) and the earlier world's suites (results/rlhf: final, tiny-paper and the studies)."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytestmark = pytest.mark.slow
data = pytest.mark.results_data


def _same_as_committed(out, committed: str) -> None:
    committed = os.path.join(ROOT, committed)
    for name in sorted(os.listdir(committed)):
        new = (out / name).read_bytes()
        old = open(os.path.join(committed, name), "rb").read()
        if name.endswith(".md"):  # the command names the output folder; a link is relative to it
            new, old = (
                [x for x in t.decode().splitlines() if not x.startswith(("Command:", "Full table"))]
                for t in (new, old)
            )
        assert new == old, name


@pytest.mark.parametrize(
    "suite",
    [
        pytest.param("v3/final", marks=data("rlhf/v3")),
        pytest.param("final", marks=data("rlhf/final")),
        pytest.param("tiny-paper", marks=data("rlhf/tiny-paper")),
    ],
)
def test_suite_report_rebuilds(tmp_path, suite):
    from rgpo_lab.rlhf_report.__main__ import main

    main([os.path.join(ROOT, "results/rlhf", suite), "--out", str(tmp_path)])
    _same_as_committed(tmp_path, f"results/rlhf/{suite}/report")


@pytest.mark.parametrize(
    "world",
    [
        pytest.param("v3", marks=data("rlhf/v3")),
        pytest.param("", marks=data("rlhf/final", "rlhf/frontier", "rlhf/reuse")),
    ],
)
def test_studies_report_rebuilds(tmp_path, monkeypatch, world):
    from rgpo_lab.rlhf_report import build
    from rgpo_lab.rlhf_report.__main__ import main

    # the studies' command also rebuilds final/report in place: here into tmp_path, never the checkout
    build_report = build.build_report
    monkeypatch.setattr(
        build, "build_report", lambda r, out, *a: build_report(r, str(tmp_path / "final"), *a)
    )
    results = os.path.join("results/rlhf", world)
    main([os.path.join(ROOT, results), "--studies", "--out", str(tmp_path / "studies")])
    _same_as_committed(tmp_path / "studies", os.path.join(results, "report"))
    _same_as_committed(tmp_path / "final", os.path.join(results, "final/report"))


@data("rlhf/v3")
def test_v3_mismatch_report_rebuilds(tmp_path):
    from rgpo_lab import rlhf_mismatch_report

    assert rlhf_mismatch_report.main(["--out", str(tmp_path)]) in (None, 0)
    _same_as_committed(tmp_path, "results/rlhf/v3/mismatch/report")
