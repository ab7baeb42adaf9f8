"""What the benchmarks share: the repository root, and a result written as JSON and Markdown (under
results/benchmarks/) with the command, machine and load average that produced it."""

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
