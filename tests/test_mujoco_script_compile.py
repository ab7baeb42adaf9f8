"""`--compile` in the single-file scripts (mujoco_baselines/<method>_continuous_action.py) is the lab
runner's `--compile` (rgpo_lab.mujoco_runner, whose compiled path made the committed --compile runs): on the
same seed a short run of each gives the same episodes, the same logged metrics per iteration, bit-identical
final parameters and the same deterministic evaluation. Both run in this process, as in
test_mujoco_script_vs_lab.py (whose helpers these are). That the compiled path is taken at all: its final
parameters differ from the eager script's (float rounding), by little."""

from __future__ import annotations

import pytest
import torch
from _mujoco_utils import needs_compiler
from test_mujoco_script_vs_lab import KL_PENALTY, SHORT, STALE, Recorder, compare, run_lab, run_script

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

FAST = ["--num-minibatches", "4", "--compile"]
CASES = [
    pytest.param("ppo", [], {}, (), id="ppo"),
    pytest.param("rgpo", [], {}, (), id="rgpo", marks=pytest.mark.slow),
    pytest.param("trpo", [], {}, (), id="trpo", marks=pytest.mark.slow),
    pytest.param("awr", [], {}, (), id="awr", marks=pytest.mark.slow),
    pytest.param(
        "ppo",
        ["--policy-lag", "2", "--decoupled", "--kl-penalty", "--kl-target", "0.002"],
        dict(policy_lag=2, decoupled=True, kl_penalty=True, kl_target=0.002),
        [*STALE.items(), *KL_PENALTY.items()],
        id="ppo-lag2-dec-klpen",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "rgpo",
        ["--policy-lag", "2", "--decoupled"],
        dict(policy_lag=2, decoupled=True),
        STALE.items(),
        id="rgpo-lag2-dec",
        marks=pytest.mark.slow,
    ),
]


@needs_compiler
@pytest.mark.parametrize("method,flags,overrides,extra", CASES)
def test_script_compile_is_the_runners_compile(method, flags, overrides, extra, tmp_path, monkeypatch):
    script = run_script(method, [*SHORT, *FAST, *flags], tmp_path / "script", monkeypatch)
    lab = run_lab(method, dict(overrides, compile=True), tmp_path, monkeypatch)
    compare(method, script, lab, extra)


@needs_compiler
@pytest.mark.slow
def test_compiled_script_differs_from_eager_by_rounding(tmp_path, monkeypatch):
    """The check can fail: the eager script is not the compiled one bit for bit (so the compiled path ran),
    yet after 3 iterations its parameters are within float32 rounding's drift of it."""
    _, fast = run_script("ppo", [*SHORT, *FAST], tmp_path / "fast", monkeypatch)
    _, eager = run_script("ppo", [*SHORT, *FAST[:-1]], tmp_path / "eager", monkeypatch)
    a, b = fast.state_dict(), eager.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("method", ["ppo", "rgpo", "trpo", "awr"])
def test_compile_without_a_cpp_compiler_stops_in_one_line(method, tmp_path, monkeypatch):
    """No C++ compiler for inductor: the script stops at setup with one line naming the flag, before its
    TensorBoard writer exists (nothing written)."""

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr("torch._inductor.cpp_builder.get_cpp_compiler", no_compiler)
    Recorder.last = None
    with pytest.raises(SystemExit) as stop:
        run_script(method, [*SHORT, *FAST], tmp_path, monkeypatch)
    assert str(stop.value).startswith("error: compile: torch.compile needs a C++ compiler (no working C++")
    assert Recorder.last is None
