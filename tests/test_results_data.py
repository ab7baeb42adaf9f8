"""Per-step logs out of the tree (rgpo_lab.results_data): untrack and pack in a scratch repository, restore
byte for byte from its history, the refusals, the one reader, and the tracked tree of this checkout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from rgpo_lab import results_data as rd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True).stdout.decode()


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def repo(tmp_path):
    """A repository with two suites of tracked logs (two runs each) and a config file per run."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@t")
    git(root, "config", "user.name", "t")
    for suite in ("area/a", "area/b"):
        for run in ("r0", "r1"):
            write(root / "results" / suite / run / "metrics.csv", f"step,x\n1,{suite}{run}\n2,0.5\n")
            write(root / "results" / suite / run / "config.json", "{}")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "runs")
    return root


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_untrack_records_at_head_and_restore_writes_the_same_bytes(repo):
    log = repo / "results/area/a/r0/metrics.csv"
    before = log.read_bytes()
    head = git(repo, "rev-parse", "HEAD").strip()
    rec = rd.untrack(str(repo), ["area/a"])["area/a"]
    git(repo, "commit", "-q", "-m", "untrack")
    assert rec.commit == head and sorted(rec.files) == ["area/a/r0/metrics.csv", "area/a/r1/metrics.csv"]
    assert rec.files["area/a/r0/metrics.csv"] == hashlib.sha256(before).hexdigest()
    tracked = git(repo, "ls-files").split()
    assert "results/area/a/r0/metrics.csv" not in tracked and "results/area/b/r0/metrics.csv" in tracked
    assert "results/per_step_data.json" in tracked and log.exists()  # the file stays on disk
    for p in (repo / "results/area/a").glob("*/metrics.csv"):
        p.unlink()
    assert rd.status(str(repo))["area/a"].missing == 2
    st = rd.restore(str(repo))["area/a"]
    assert (st.restored, st.missing, st.different) == (2, 0, [])
    assert log.read_bytes() == before
    saved = json.loads((repo / rd.MANIFEST).read_text())
    assert saved["suites"]["area/a"]["commit"] == head and saved["suites"]["area/a"]["source"] == "tree"


def test_pack_commits_a_deterministic_pack_then_removes_it_and_restores_from_it(repo):
    rd.untrack(str(repo), ["area/b"])
    git(repo, "commit", "-q", "-m", "untrack b")
    logs = sorted((repo / "results/area/b").glob("*/metrics.csv"))
    contents = {p: p.read_bytes() for p in logs}
    first = rd.pack_bytes(str(repo), ["area/b/r0/metrics.csv", "area/b/r1/metrics.csv"])
    assert first == rd.pack_bytes(str(repo), ["area/b/r1/metrics.csv", "area/b/r0/metrics.csv"])
    rec = rd.pack(str(repo), "area/b")
    assert rec.source == "pack" and rec.pack_sha256 == hashlib.sha256(first).hexdigest()
    # two commits: the pack alone, then its removal with the manifest
    assert git(repo, "show", "--name-only", "--format=", rec.commit).split() == [rec.pack]
    assert sorted(git(repo, "show", "--name-only", "--format=", "HEAD").split()) == [rd.MANIFEST, rec.pack]
    assert git(repo, "show", "--format=", "--diff-filter=D", "--name-only", "HEAD").split() == [rec.pack]
    assert rec.pack not in git(repo, "ls-files") and not (repo / rec.pack).exists()
    for p in logs:
        p.unlink()
    assert rd.restore(str(repo))["area/b"].restored == 2
    assert {p: p.read_bytes() for p in logs} == contents


def test_a_file_with_another_checksum_is_kept_unless_forced(repo):
    rd.untrack(str(repo), ["area/a"])
    git(repo, "commit", "-q", "-m", "untrack")
    log = repo / "results/area/a/r1/metrics.csv"
    log.write_text("edited\n")
    st = rd.restore(str(repo))["area/a"]
    assert st.different == ["area/a/r1/metrics.csv"] and log.read_text() == "edited\n"
    assert rd.main(["--root", str(repo), "restore"]) == 1
    assert rd.main(["restore", "--root", str(repo)]) == 1  # --root after the command: the same checkout
    assert rd.restore(str(repo), force=True)["area/a"].complete
    assert log.read_text() == "step,x\n1,area/ar1\n2,0.5\n"


def test_a_corrupt_record_writes_nothing(repo):
    rd.untrack(str(repo), ["area/a"])
    git(repo, "commit", "-q", "-m", "untrack")
    manifest = json.loads((repo / rd.MANIFEST).read_text())
    manifest["suites"]["area/a"]["files"]["area/a/r1/metrics.csv"] = "0" * 64
    (repo / rd.MANIFEST).write_text(json.dumps(manifest))
    for p in (repo / "results/area/a").glob("*/metrics.csv"):
        p.unlink()
    with pytest.raises(rd.PerStepDataError, match="another SHA-256"):
        rd.restore(str(repo))
    assert not list((repo / "results/area/a").glob("*/metrics.csv"))  # r0 was fine but is not written either


def test_a_commit_missing_from_the_clone_is_one_line(repo, capsys):
    rd.untrack(str(repo), ["area/a"])
    git(repo, "commit", "-q", "-m", "untrack")
    manifest = json.loads((repo / rd.MANIFEST).read_text())
    manifest["suites"]["area/a"]["commit"] = "f" * 40
    (repo / rd.MANIFEST).write_text(json.dumps(manifest))
    (repo / "results/area/a/r0/metrics.csv").unlink()
    assert rd.main(["--root", str(repo), "restore"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "git fetch --unshallow" in err and "area/a" in err


def test_refusals(repo):
    write(repo / "staged.txt", "x")
    git(repo, "add", "staged.txt")
    with pytest.raises(rd.PerStepDataError, match="staged changes"):
        rd.untrack(str(repo), ["area/a"])
    git(repo, "commit", "-q", "-m", "staged")
    with pytest.raises(rd.PerStepDataError, match="no tracked metrics.csv"):
        rd.untrack(str(repo), ["area/none"])
    (repo / "results/area/a/r0/metrics.csv").write_text("uncommitted\n")
    with pytest.raises(rd.PerStepDataError, match="differs from HEAD"):
        rd.untrack(str(repo), ["area/a"])
    with pytest.raises(rd.PerStepDataError, match="not in results/per_step_data.json"):
        rd.restore(str(repo), ["area/none"])


def test_open_metrics_refuses_a_recorded_log_that_is_not_restored(repo, tmp_path):
    rd.untrack(str(repo), ["area/a"])
    git(repo, "commit", "-q", "-m", "untrack")
    run = repo / "results/area/a/r0"
    with rd.open_metrics(str(run), root=str(repo)) as f:
        assert f.read().startswith("step,x")
    (run / "metrics.csv").unlink()
    with pytest.raises(rd.PerStepDataError, match="make results-data"):
        rd.open_metrics(str(run), root=str(repo))
    # a copy of the results folder elsewhere (a `git archive` snapshot) is matched by its trailing path
    snapshot = tmp_path / "snapshot" / "results" / "area" / "a" / "r1"
    snapshot.mkdir(parents=True)
    with pytest.raises(rd.PerStepDataError, match="not restored"):
        rd.open_metrics(str(snapshot), root=str(repo))
    # a run the manifest does not know simply has no log yet; `required` makes that an error too
    assert rd.open_metrics(str(tmp_path / "fresh"), root=str(repo)) is None
    with pytest.raises(rd.PerStepDataError, match="does not exist"):
        rd.open_metrics(str(tmp_path / "fresh"), required=True, root=str(repo))


def test_a_broken_manifest_is_refused_in_one_line(repo):
    (repo / "results" / "per_step_data.json").write_text('{"suites": {"x": {"source": "tape"}}}')
    with pytest.raises(rd.PerStepDataError, match="not a valid per-step data manifest"):
        rd.Manifest.load(str(repo))


# ------------------------------------------------------------------------------------------ this checkout
def _tracked() -> list[str]:
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_recorded_log_is_tracked_and_every_record_belongs_to_a_tracked_run():
    tracked = set(_tracked())
    manifest = rd.Manifest.load(ROOT)
    assert manifest.suites, "results/per_step_data.json records no suite"
    for suite, rec in manifest.suites.items():
        for p in rec.files:
            assert f"results/{p}" not in tracked, f"results/{p} is recorded ({suite}) and still tracked"
            run_dir = os.path.dirname(f"results/{p}")
            assert any(t.startswith(run_dir + "/") for t in tracked), f"{run_dir} has no tracked file left"


def _tracked_sizes() -> dict[str, int]:
    """Tracked path -> its size in the index (what a clone checks out; ignored files on disk do not count)."""
    entries = [e.split("\t", 1) for e in git(ROOT, "ls-files", "-z", "-s").split("\0") if e]
    specs = "".join(meta.split()[1] + "\n" for meta, _ in entries)
    out = subprocess.run(
        ["git", "-C", ROOT, "cat-file", "--batch-check=%(objectsize)"],
        input=specs.encode(),
        capture_output=True,
        check=True,
    )
    return {p: int(n) for (_, p), n in zip(entries, out.stdout.split(), strict=True)}


def test_no_per_step_log_is_tracked():
    """Every per-step log is out of the tree (issue 56): none tracked anywhere, under any suite, recorded
    or not, and no pack left behind (a pack is committed alone and removed in the next commit)."""
    logs = [
        p
        for p in _tracked()
        if os.path.basename(p) in (rd.LOG_NAME, "metrics.jsonl") or p.startswith(rd.PACK_DIR + "/")
    ]
    assert not logs, (
        f"{len(logs)} per-step logs tracked, e.g. {logs[0]}: python -m rgpo_lab.results_data untrack"
    )


def test_the_tracked_tree_is_at_most_20_mib():
    """The whole tracked tree (issue 56: <= 20 MiB), so a working tree travels to a GPU machine (64 MiB
    limit) with room for carried wheels."""
    _tracked()
    sizes = _tracked_sizes()
    total = sum(sizes.values())
    largest = max(sizes, key=sizes.get)
    assert total <= 20 * 2**20, (
        f"tracked tree {total / 2**20:.1f} MiB (largest: {largest}, {sizes[largest] / 2**20:.1f} MiB)"
    )


def test_untrack_takes_several_suites_in_one_index_change(repo):
    records = rd.untrack(str(repo), ["area/a", "area/b"])
    assert sorted(records) == ["area/a", "area/b"]
    assert not [p for p in git(repo, "ls-files").split() if p.endswith("metrics.csv")]
    with pytest.raises(rd.PerStepDataError, match="staged changes"):  # the removal is staged, not committed
        rd.untrack(str(repo), ["area/a"])


def test_pack_refuses_tracked_logs_and_logs_another_suite_records(repo):
    with pytest.raises(rd.PerStepDataError, match="is tracked: untrack the suite"):
        rd.pack(str(repo), "area/a")
    rd.untrack(str(repo), ["area"])  # a suite named by the parent folder records both
    git(repo, "commit", "-q", "-m", "untrack area")
    with pytest.raises(rd.PerStepDataError, match="is recorded by suite area already"):
        rd.pack(str(repo), "area/a")


def test_a_manifest_recording_one_file_twice_is_refused(repo):
    rd.untrack(str(repo), ["area/a"])
    git(repo, "commit", "-q", "-m", "untrack")
    manifest = json.loads((repo / rd.MANIFEST).read_text())
    manifest["suites"]["area"] = manifest["suites"]["area/a"]
    (repo / rd.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(rd.PerStepDataError, match="is recorded by area"):
        rd.Manifest.load(str(repo))
