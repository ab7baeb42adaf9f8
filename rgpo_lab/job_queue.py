"""Run a queue of subprocesses N at a time, on this machine or as Ray tasks: the scheduler shared by the
MuJoCo grid (``rgpo_lab/mujoco_grid.py``) and the RLHF suite (``rgpo_lab/rlhf_suite.py``).

The suites decide what a run is: its command and log file when it starts (a resumed run looks for its
checkpoint then), whether it succeeded when it ends, and what the progress display shows. Interrupted
(Ctrl-C, SIGTERM turned into SystemExit), the queue stops the runs in progress; they resume next time.
Torch-free.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class LocalBackend:
    """Each run is a subprocess on this machine, its output appended to its log."""

    def __init__(self, env: dict, cwd: str):
        self.env, self.cwd = env, cwd

    def start(self, command: list[str], log_path: str):
        log = open(log_path, "a")
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd
        ), log

    def poll(self, handle) -> int | None:
        return handle[0].poll()

    def stop(self, handle) -> None:
        handle[0].terminate()
        handle[0].wait()

    def close(self, handle) -> None:
        handle[1].close()


class RayBackend:
    """Each run is a Ray task (one CPU) running the same command on a node of the cluster (``address``; None
    starts a local Ray instance). The repository must be at the same path on every node, and the results and
    checkpoint folders on storage every node sees, so that skip and resume work as with the local backend."""

    def __init__(self, env: dict, cwd: str, address: str | None = None):
        import ray

        self.ray = ray
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)

        @ray.remote(num_cpus=1)
        def run(command: list[str], log_path: str, env: dict) -> int:
            with open(log_path, "a") as log:
                return subprocess.run(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd
                ).returncode

        self.run, self.env = run, env

    def start(self, command: list[str], log_path: str):
        return self.run.remote(command, log_path, self.env)

    def poll(self, handle) -> int | None:
        ready, _ = self.ray.wait([handle], timeout=0)
        return self.ray.get(handle) if ready else None

    def stop(self, handle) -> None:
        self.ray.cancel(handle, force=True)

    def close(self, handle) -> None:
        pass


def run_queue(
    items: Sequence[T],
    jobs: int,
    start: Callable[[T], tuple[list[str], str]],
    *,
    env: dict | None = None,
    cwd: str | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    poll: float = 2.0,
    succeeded: Callable[[T, int], bool] = lambda item, code: code == 0,
    on_poll: Callable[[int, int, int], Any] | None = None,
) -> list[tuple[T, int]]:
    """Run ``items`` ``jobs`` at a time; returns the failed ones with their exit status.

    ``start(item)`` -> (command, log path), called when the item starts; ``succeeded(item, exit status)``,
    called when it ends (a suite may check its output files or clean up there);
    ``on_poll(ended, running, failed)`` after every poll."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    env = dict(os.environ if env is None else env)
    executor = RayBackend(env, cwd, ray_address) if backend == "ray" else LocalBackend(env, cwd)
    todo, running, failed, ended = list(items), {}, [], 0
    try:
        while todo or running:
            while todo and len(running) < jobs:
                item = todo.pop(0)
                command, log_path = start(item)
                running[item] = executor.start(command, log_path)
            time.sleep(poll)
            for item, handle in list(running.items()):
                code = executor.poll(handle)
                if code is not None:
                    executor.close(handle)
                    del running[item]
                    ended += 1
                    if not succeeded(item, code):
                        failed.append((item, code))
            if on_poll is not None:
                on_poll(ended, len(running), len(failed))
    finally:
        for handle in running.values():  # interrupted: stop the runs in progress; they resume next time
            executor.stop(handle)
            executor.close(handle)
    return failed
