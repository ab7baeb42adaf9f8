"""rgpo_lab.job_queue: N at a time, exit statuses, the suite's success check, logs, and stopping on
interrupt."""

from __future__ import annotations

import json
import sys
import time

import pytest

from rgpo_lab.job_queue import run_queue


def _job(tmp_path, name: str, seconds: float, code: int) -> list[str]:
    """A child that records when it ran, sleeps, prints its name and exits with ``code``."""
    out = str(tmp_path / f"{name}.json")
    script = (
        f"import json, sys, time; t0 = time.time(); time.sleep({seconds!r}); print({name!r}); "
        f"open({out!r}, 'w').write(json.dumps([t0, time.time()])); sys.exit({code})"
    )
    return [sys.executable, "-c", script]


def test_runs_n_at_a_time_and_reports_failures(tmp_path):
    jobs = {"a": 0, "b": 3, "c": 0, "d": 0, "e": 1}
    polls, checked = [], []

    def start(name):
        return _job(tmp_path, name, 0.4, jobs[name]), str(tmp_path / f"{name}.log")

    def succeeded(name, code):
        checked.append((name, code))
        return code == 0 and name != "d"  # a suite may also fail a run that exited 0 (missing outputs)

    failed = run_queue(
        list(jobs), 2, start, poll=0.05, succeeded=succeeded, on_poll=lambda *a: polls.append(a)
    )
    assert sorted(failed) == [("b", 3), ("d", 0), ("e", 1)]
    assert sorted(checked) == sorted(jobs.items())
    assert polls[-1] == (5, 0, 3)
    assert all((tmp_path / f"{n}.log").read_text().strip() == n for n in jobs)
    spans = [json.loads((tmp_path / f"{n}.json").read_text()) for n in jobs]
    for t0, _ in spans:  # never more than 2 running at once
        assert sum(s <= t0 < e for s, e in spans) <= 2
    assert max(sum(s <= t0 < e for s, e in spans) for t0, _ in spans) == 2  # and 2 did run side by side


def test_interrupt_stops_the_runs_in_progress(tmp_path):
    def start(name):
        return _job(tmp_path, name, 30, 0), str(tmp_path / f"{name}.log")

    def interrupt(*_):
        raise KeyboardInterrupt

    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        run_queue(["a", "b"], 2, start, poll=0.2, on_poll=interrupt)
    assert time.time() - t0 < 10  # terminated, not waited for
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()


def test_refuses_zero_jobs():
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        run_queue(["a"], 0, lambda name: ([sys.executable, "-c", ""], "/dev/null"))
