"""Per-step run logs kept out of the tracked tree but reachable from ``main``'s own history.

Only the branch ``main`` of this repository is kept, and a working tree over 64 MiB cannot travel to a GPU
machine, so the per-step logs (``results/**/metrics.csv``) are not tracked: ``results/per_step_data.json``
records, per suite, where each log lives in ``main``'s history and its SHA-256, and ``make results-data``
(``python -m rgpo_lab.results_data restore``) writes them back to their paths (ignored by git) offline from
the clone. Two kinds of record:

- ``tree``: the logs were tracked at their own paths at ``commit`` (the suites run before the move; taken
  out of the tree by ``untrack``);
- ``pack``: one deterministic ``.tar.xz`` of a suite's logs was committed at ``commit`` and removed in the
  next commit (new suites, by ``pack``: a compressed binary adds little to a clone or a diff).

Every reader of a metrics file goes through `open_metrics`, which refuses a recorded log that has not been
restored instead of reading it as "no data". Standard library only: it runs before ``make install``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join("results", "per_step_data.json")
PACK_DIR = os.path.join("results", "per_step_packs")
LOG_NAME = "metrics.csv"
RESTORE_HINT = "make results-data"


class PerStepDataError(RuntimeError):
    """A per-step log that cannot be read or restored as recorded (one line, says what to do)."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- the manifest
@dataclass
class SuiteRecord:
    """Where one suite's logs live: ``files`` maps a path relative to ``results/`` to its SHA-256."""

    source: str  # "tree" or "pack"
    commit: str
    files: dict[str, str]
    pack: str | None = None  # the pack's path in the repository (source "pack")
    pack_sha256: str | None = None

    def to_json(self) -> dict:
        out: dict = {"source": self.source, "commit": self.commit}
        if self.source == "pack":
            out |= {"pack": self.pack, "pack_sha256": self.pack_sha256}
        return out | {"files": dict(sorted(self.files.items()))}


@dataclass
class Manifest:
    suites: dict[str, SuiteRecord] = field(default_factory=dict)

    @classmethod
    def load(cls, root: str = ROOT) -> Manifest:
        path = os.path.join(root, MANIFEST)
        if not os.path.isfile(path):
            return cls()
        try:
            with open(path) as f:
                raw = json.load(f)
            suites = {
                name: SuiteRecord(
                    source=rec["source"],
                    commit=rec["commit"],
                    files=dict(rec["files"]),
                    pack=rec.get("pack"),
                    pack_sha256=rec.get("pack_sha256"),
                )
                for name, rec in raw["suites"].items()
            }
        except (ValueError, KeyError, TypeError) as e:
            raise PerStepDataError(f"{path} is not a valid per-step data manifest ({e!r})") from e
        owner: dict[str, str] = {}
        for name, rec in suites.items():
            if rec.source not in ("tree", "pack") or (rec.source == "pack" and not rec.pack):
                raise PerStepDataError(f"{path}: suite {name}: source must be 'tree' or 'pack' (with a path)")
            for p in rec.files:
                if owner.setdefault(p, name) != name:
                    raise PerStepDataError(f"{path}: results/{p} is recorded by {owner[p]} and by {name}")
        return cls(suites)

    def save(self, root: str = ROOT) -> None:
        raw = {
            "about": "per-step logs out of the tree; restore: make results-data",
            "suites": {name: self.suites[name].to_json() for name in sorted(self.suites)},
        }
        path = os.path.join(root, MANIFEST)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(raw, f, indent=1)
            f.write("\n")
        os.replace(path + ".tmp", path)
        _recorded_cache.pop(os.path.abspath(root), None)

    def recorded_files(self) -> dict[str, tuple[str, str]]:
        """path relative to results/ -> (suite, sha256), the latest record of each path winning."""
        return {p: (name, h) for name, rec in self.suites.items() for p, h in rec.files.items()}


_recorded_cache: dict[str, frozenset[str]] = {}


def _recorded_paths(root: str = ROOT) -> frozenset[str]:
    key = os.path.abspath(root)
    if key not in _recorded_cache:
        _recorded_cache[key] = frozenset(Manifest.load(root).recorded_files())
    return _recorded_cache[key]


def recorded_key(path: str, root: str = ROOT) -> str | None:
    """The manifest key of ``path`` (any copy of a results folder, a ``git archive`` snapshot too: matched by
    its trailing components), or None when no suite records it."""
    parts = os.path.abspath(path).split(os.sep)
    recorded = _recorded_paths(root)
    for i in range(1, len(parts)):
        key = "/".join(parts[i:])
        if key in recorded:
            return key
    return None


# ------------------------------------------------------------------------------------------ the one reader
def open_metrics(
    run_dir: str, name: str = LOG_NAME, required: bool = False, root: str = ROOT
) -> IO[str] | None:
    """The run's per-step log opened for reading (newline="" as the csv module wants), or None when the run
    has none yet (``required``: raise instead). A log that the manifest records but that is not on disk raises
    `PerStepDataError` naming the file and the restore command: a report must not read a missing log as "no
    data"."""
    path = os.path.join(run_dir, name)
    if os.path.isfile(path):
        return open(path, newline="")
    if recorded_key(path, root) is not None:
        raise PerStepDataError(f"{path} is recorded in {MANIFEST} but not restored: run `{RESTORE_HINT}`")
    if required:
        raise PerStepDataError(f"{path} does not exist")
    return None


# ------------------------------------------------------------------------------------------------------ git
def _git(root: str, *args: str, data: bytes | None = None) -> bytes:
    out = subprocess.run(["git", "-C", root, *args], input=data, capture_output=True)
    if out.returncode != 0:
        raise PerStepDataError(f"git {' '.join(args)} failed: {out.stderr.decode().strip()}")
    return out.stdout


def _has_commit(root: str, commit: str) -> bool:
    out = subprocess.run(["git", "-C", root, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return out.returncode == 0


def _blobs(root: str, specs: list[str]) -> list[bytes]:
    """The contents of ``<commit>:<path>`` objects, in one ``git cat-file --batch``."""
    out = _git(root, "cat-file", "--batch", data="".join(s + "\n" for s in specs).encode())
    blobs, pos = [], 0
    for spec in specs:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        if len(header) != 3 or header[1] != b"blob":
            raise PerStepDataError(f"{spec} is not in this clone ({out[pos:end].decode()})")
        size = int(header[2])
        blobs.append(out[end + 1 : end + 1 + size])
        pos = end + 1 + size + 1
    return blobs


def _suite_contents(root: str, name: str, rec: SuiteRecord) -> dict[str, bytes]:
    """Every recorded file of a suite read from the history, each checked against its SHA-256 (the whole
    suite is checked before anything is written)."""
    if not _has_commit(root, rec.commit):
        raise PerStepDataError(
            f"suite {name}: commit {rec.commit[:12]} is not in this clone (a shallow clone?): "
            "run `git fetch --unshallow`, then again"
        )
    paths = sorted(rec.files)
    if rec.source == "tree":
        contents = dict(zip(paths, _blobs(root, [f"{rec.commit}:results/{p}" for p in paths]), strict=True))
    else:
        (pack,) = _blobs(root, [f"{rec.commit}:{rec.pack}"])
        if sha256_bytes(pack) != rec.pack_sha256:
            raise PerStepDataError(f"suite {name}: {rec.pack} at {rec.commit[:12]} has another SHA-256")
        contents = {}
        with tarfile.open(fileobj=io.BytesIO(pack), mode="r:xz") as tar:
            for member in tar.getmembers():
                if member.isfile():
                    contents[member.name] = tar.extractfile(member).read()
        missing = sorted(set(paths) - set(contents))
        if missing:
            raise PerStepDataError(f"suite {name}: {rec.pack} lacks {missing[0]} ({len(missing)} files)")
    for p in paths:
        if sha256_bytes(contents[p]) != rec.files[p]:
            raise PerStepDataError(f"suite {name}: results/{p} at {rec.commit[:12]} has another SHA-256")
    return {p: contents[p] for p in paths}


# ------------------------------------------------------------------------------------------ restore, status
@dataclass
class SuiteStatus:
    restored: int = 0
    missing: int = 0
    different: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.missing == 0 and not self.different


def status(root: str = ROOT, suites: Iterable[str] | None = None) -> dict[str, SuiteStatus]:
    """Per suite: how many recorded logs are on disk with their checksum, missing, or different."""
    manifest = Manifest.load(root)
    out = {}
    for name in suites if suites is not None else sorted(manifest.suites):
        if name not in manifest.suites:
            raise PerStepDataError(f"suite {name} is not in {MANIFEST} (known: {', '.join(manifest.suites)})")
        st = SuiteStatus()
        for p, h in sorted(manifest.suites[name].files.items()):
            path = os.path.join(root, "results", p)
            if not os.path.isfile(path):
                st.missing += 1
            elif sha256_file(path) == h:
                st.restored += 1
            else:
                st.different.append(p)
        out[name] = st
    return out


def restore(
    root: str = ROOT, suites: Iterable[str] | None = None, force: bool = False
) -> dict[str, SuiteStatus]:
    """Write every recorded log of ``suites`` (all by default) back to ``results/``. A file already there
    with its checksum is left alone; one with another checksum is kept (in ``different``) unless ``force``."""
    manifest = Manifest.load(root)
    result = {}
    for name in suites if suites is not None else sorted(manifest.suites):
        if name not in manifest.suites:
            raise PerStepDataError(f"suite {name} is not in {MANIFEST} (known: {', '.join(manifest.suites)})")
        rec = manifest.suites[name]
        st = SuiteStatus()
        todo = []
        for p, h in sorted(rec.files.items()):
            path = os.path.join(root, "results", p)
            if os.path.isfile(path):
                if sha256_file(path) == h:
                    st.restored += 1
                    continue
                if not force:
                    st.different.append(p)
                    continue
            todo.append(p)
        if todo:
            contents = _suite_contents(root, name, rec)
            for p in todo:
                path = os.path.join(root, "results", p)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path + ".tmp", "wb") as f:
                    f.write(contents[p])
                os.replace(path + ".tmp", path)
                st.restored += 1
        result[name] = st
    return result


# ---------------------------------------------------------------------------------------- untrack and pack
def _clean_index(root: str) -> None:
    if _git(root, "diff", "--cached", "--name-only").strip():
        raise PerStepDataError("the git index has staged changes: commit or unstage them first")


def _logs_under(root: str, suite: str) -> list[str]:
    """The per-step logs on disk under results/<suite>, as paths relative to results/."""
    base = os.path.join(root, "results", suite)
    if not os.path.isdir(base):
        raise PerStepDataError(f"results/{suite} is not a folder")
    found = []
    for d, _, names in os.walk(base):
        if LOG_NAME in names:
            found.append(os.path.relpath(os.path.join(d, LOG_NAME), os.path.join(root, "results")))
    if not found:
        raise PerStepDataError(f"results/{suite} holds no {LOG_NAME}")
    return sorted(p.replace(os.sep, "/") for p in found)


def untrack(root: str, suites: list[str]) -> dict[str, SuiteRecord]:
    """Record the tracked logs of each ``results/<suite>`` at HEAD (source ``tree``) and remove them from the
    index (the files stay on disk, ignored); then commit the manifest and the removal together."""
    _clean_index(root)
    head = _git(root, "rev-parse", "HEAD").decode().strip()
    records = {}
    for suite in suites:  # every suite checked before the index changes
        tracked = _git(root, "ls-files", "-z", "--", f"results/{suite}").decode().split("\0")
        logs = sorted(p[len("results/") :] for p in tracked if p.endswith("/" + LOG_NAME))
        if not logs:
            raise PerStepDataError(f"results/{suite} has no tracked {LOG_NAME}")
        if _git(root, "status", "--porcelain", "--", *(f"results/{p}" for p in logs)).strip():
            raise PerStepDataError(f"results/{suite}: a log differs from HEAD: commit it first")
        blobs = _blobs(root, [f"{head}:results/{p}" for p in logs])
        records[suite] = SuiteRecord(
            "tree", head, {p: sha256_bytes(b) for p, b in zip(logs, blobs, strict=True)}
        )
    manifest = Manifest.load(root)
    for suite, rec in records.items():
        manifest.suites[suite] = rec
        _git(root, "rm", "-q", "--cached", "--", *(f"results/{p}" for p in rec.files))
    manifest.save(root)
    _git(root, "add", MANIFEST)
    return records


def pack_bytes(root: str, logs: list[str]) -> bytes:
    """A deterministic tar.xz of ``logs`` (paths relative to results/): sorted, no times, owners or modes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(logs):
            with open(os.path.join(root, "results", p), "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(p)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack(root: str, suite: str, message: str | None = None) -> SuiteRecord:
    """Pack the logs of ``results/<suite>`` (ignored, on disk) into one tar.xz, commit it alone, then remove
    it in a second commit that records it in the manifest: two commits, the logs reachable from the first."""
    _clean_index(root)
    logs = _logs_under(root, suite)
    tracked = _git(root, "ls-files", "--", *(f"results/{p}" for p in logs)).split()
    if tracked:
        raise PerStepDataError(f"{tracked[0].decode()} is tracked: untrack the suite instead of packing it")
    recorded = Manifest.load(root).recorded_files()
    for p in logs:
        if p in recorded and recorded[p][0] != suite:
            raise PerStepDataError(f"results/{p} is recorded by suite {recorded[p][0]} already")
    data = pack_bytes(root, logs)
    rel = f"{PACK_DIR}/{suite.replace('/', '__')}.tar.xz".replace(os.sep, "/")
    os.makedirs(os.path.join(root, PACK_DIR), exist_ok=True)
    with open(os.path.join(root, rel), "wb") as f:
        f.write(data)
    _git(root, "add", "-f", rel)
    _git(root, "commit", "-q", "-m", message or f"per-step logs of results/{suite}: {len(logs)} files packed")
    commit = _git(root, "rev-parse", "HEAD").decode().strip()
    files = {}
    for p in logs:
        files[p] = sha256_file(os.path.join(root, "results", p))
    rec = SuiteRecord("pack", commit, files, pack=rel, pack_sha256=sha256_bytes(data))
    manifest = Manifest.load(root)
    manifest.suites[suite] = rec
    manifest.save(root)
    _git(root, "rm", "-q", "--cached", rel)
    os.remove(os.path.join(root, rel))
    _git(root, "add", MANIFEST)
    _git(root, "commit", "-q", "-m", f"per-step logs of results/{suite}: pack of {commit[:12]} recorded")
    return rec


# ------------------------------------------------------------------------------------------------------ CLI
def _print_status(result: dict[str, SuiteStatus]) -> int:
    bad = 0
    for name, st in result.items():
        extra = f", {len(st.different)} different (kept; --force to overwrite)" if st.different else ""
        print(f"{name}: {st.restored} restored, {st.missing} missing{extra}")
        for p in st.different[:5]:
            print(f"  different: results/{p}")
        bad += not st.complete
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rgpo_lab.results_data", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=ROOT, help="the checkout (default: this one)")
    after = argparse.ArgumentParser(add_help=False)  # --root after the command too; unset: the one before
    after.add_argument("--root", default=argparse.SUPPRESS, help="the checkout (default: this one)")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[after])

    r = add("restore", help="write the recorded per-step logs back into results/ (offline)")
    r.add_argument("suites", nargs="*", help="suites as recorded, e.g. rlhf/v3 (default: all)")
    r.add_argument("--force", action="store_true", help="overwrite a log on disk that has another checksum")
    s = add("status", help="per suite: restored / missing / different")
    s.add_argument("suites", nargs="*")
    u = add("untrack", help="record a suite's tracked logs at HEAD and remove them from the index")
    u.add_argument("suites", nargs="+")
    k = add("pack", help="pack a new suite's logs, commit the pack, then record and remove it")
    k.add_argument("suite")
    args = p.parse_args(argv)
    try:
        if args.command == "restore":
            return _print_status(restore(args.root, args.suites or None, force=args.force))
        if args.command == "status":
            return _print_status(status(args.root, args.suites or None))
        if args.command == "untrack":
            for suite, rec in untrack(args.root, args.suites).items():
                print(f"{suite}: {len(rec.files)} logs recorded at {rec.commit[:12]}, removed from the index")
            print(f"now commit them: git commit -m 'per-step logs out of the tree: {' '.join(args.suites)}'")
            return 0
        rec = pack(args.root, args.suite)
        print(f"{args.suite}: {len(rec.files)} logs packed at {rec.commit[:12]}, recorded and removed")
        return 0
    except PerStepDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
