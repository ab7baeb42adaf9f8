"""What the benchmarks share: the repository root, a baseline version of the scripts, and a result
written as JSON and Markdown (under results/benchmarks/) with the command, machine and load average that
produced it. The scripts are imported as the modules they are
(``importlib.import_module("rgpo_lab.mujoco_runner.<method>_continuous_action")``)."""

from __future__ import annotations

import json
import os
import platform
import sys

# the repository root (this file is rgpo_lab/benchmarks/common.py)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# where the committed outputs live
RESULTS = os.path.join(ROOT, "results", "benchmarks")

# one torch thread and one compile worker per script run: the A/B benchmarks of the scripts compare one core's
# work
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def invocation(module: str) -> str:
    """The command that ran ``rgpo_lab.benchmarks.<module>`` with this process's arguments."""
    return f"python -m rgpo_lab.benchmarks.{module} " + " ".join(sys.argv[1:])


def run_info(module: str, with_torch: bool, **fields) -> dict:
    """The command that ran ``rgpo_lab.benchmarks.<module>`` (this process's arguments), the machine (and
    torch's version), the load average now (call it after measuring), then `fields`."""
    machine = f"{platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    if with_torch:
        import torch

        machine += f", torch {torch.__version__}"
    return {
        "command": invocation(module),
        "machine": machine,
        "load_average_at_end": os.getloadavg(),
        **fields,
    }


def write_outputs(out: str, info: dict, lines: list[str]) -> None:
    """`info` to {out}.json, `lines` to {out}.md, and the Markdown to stdout."""
    with open(out + ".json", "w") as f:
        json.dump(info, f, indent=2)
    text = "\n".join(lines) + "\n"
    with open(out + ".md", "w") as f:
        f.write(text)
    print(text)


def extract_baseline(ref: str, dest: str) -> tuple[str, str]:
    """``mujoco_baselines/`` at git ``ref`` extracted into ``dest`` (``git archive``); returns (the ref's
    commit, the current HEAD's commit), for A/B benchmarks against an earlier version of the lab runner.
    Until issue 48 the runner was ``mujoco_baselines/`` (its scripts import ``mujoco_baselines.common``: put
    ``dest`` first on ``PYTHONPATH``); a ref after the move has the single-file scripts there and is
    refused."""
    import subprocess

    def rev(name: str, check: bool) -> str:
        return subprocess.run(
            ["git", "-C", ROOT, "rev-parse", name], capture_output=True, text=True, check=check
        ).stdout.strip()

    commit, head = rev(ref, True), rev("HEAD", False)
    has_common = ["git", "-C", ROOT, "cat-file", "-e", f"{commit}:mujoco_baselines/common.py"]
    if subprocess.run(has_common, capture_output=True).returncode != 0:
        raise SystemExit(
            f"--baseline-ref {ref}: mujoco_baselines/ there is not the runner (it moved to "
            "rgpo_lab/mujoco_runner in issue 48); give a commit before the move"
        )
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", commit, "mujoco_baselines"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return commit, head
