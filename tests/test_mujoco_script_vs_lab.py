"""The product's single-file scripts (mujoco_baselines/<method>_continuous_action.py) and the lab's runner
(rgpo_lab.mujoco_runner, which made the committed results) are the same algorithm: on the same seed, eager,
a short run of each gives the same episode returns, the same logged losses, KL, entropy, explained variance
and learning rate per iteration, and bit-identical final parameters.

Both run in this process: the script as ``python <script>`` would run it (``runpy``, ``sys.argv``, in a
temporary working directory, so its ``runs/`` lands there), the runner through its ``main``. TensorBoard's
``SummaryWriter`` is replaced by a recorder in both, so the values are compared as the Python floats they were
logged as (event files keep float32). The final agents: the script's from its globals, the runner's by
recording the `Agent` it builds.

Exact where both compute a number the same way. The script's early stops (PPO's --target-kl, the KL
backstop) compare the float64 mean of the mini-batch KLs where the runner takes a float32 mean: the two
decisions differ only for a mean within float32 rounding of the threshold (not met here; a decision that went
the other way would change the parameters and fail this test)."""

from __future__ import annotations

import os
import runpy
import sys
from collections import defaultdict

import pytest
import torch
from _mujoco_utils import load, small_args

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
pytest.importorskip("tyro")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT = ["--env-id", "Hopper-v4", "--total-timesteps", "768", "--num-steps", "256"]  # 3 iterations
SHORT += ["--eval-episodes", "2"]  # the deterministic evaluation at the end, short (as EVAL_EPISODES)
EVAL_EPISODES = 2

# per iteration, the script's TensorBoard name -> the runner's (CleanRL's names where both have one)
SHARED = {
    "charts/learning_rate": "charts/learning_rate",
    "losses/value_loss": "losses/value_loss",
    "losses/policy_loss": "losses/policy_loss",
    "losses/entropy": "losses/entropy",
    "losses/approx_kl": "losses/approx_kl",
    "losses/explained_variance": "losses/explained_variance",
}
OWN = {
    "ppo": {"losses/clipfrac": "stats/clipfrac", "ppo/ess": "stats/ess", "ppo/epochs": "stats/epochs"},
    "rgpo": {
        "rgpo/kl_coef": "rgpo/kl_coef",
        "rgpo/gate_mean": "rgpo/gate_mean",
        "rgpo/rejected_frac": "rgpo/rejected_frac",
        "rgpo/ess": "stats/ess",
        "rgpo/epochs": "stats/epochs",
    },
    "trpo": {
        "trpo/kl": "stats/trpo_kl",
        "trpo/step_frac": "stats/step_frac",
        "trpo/linesearch_evals": "stats/linesearch_evals",
        "trpo/ess": "stats/ess",
    },
    "awr": {
        "awr/ess": "stats/ess",
        "awr/weight_clipfrac": "stats/weight_clipfrac",
        "awr/weight_max": "stats/weight_max",
    },
}
STALE = {"stale/behaviour_kl": "stats/behaviour_kl"}
KL_PENALTY = {"ppo/kl_coef": "stats/kl_coef"}


class Recorder:
    """Stands in for torch.utils.tensorboard.SummaryWriter: every scalar as (step, float), by tag."""

    def __init__(self, *args, **kwargs):
        self.scalars = defaultdict(list)
        Recorder.last = self

    def add_scalar(self, tag, value, step):
        self.scalars[tag].append((step, float(value)))

    def add_text(self, *args, **kwargs):
        pass

    def close(self):
        pass


def run_script(method, flags, workdir, monkeypatch):
    """``python mujoco_baselines/<method>_continuous_action.py <flags>`` in ``workdir``: (scalars, agent)."""
    path = os.path.join(ROOT, "mujoco_baselines", f"{method}_continuous_action.py")
    os.makedirs(workdir, exist_ok=True)
    with monkeypatch.context() as m:
        m.setattr("torch.utils.tensorboard.SummaryWriter", Recorder)
        m.chdir(workdir)
        m.setattr(sys, "argv", [path, *flags])
        script_globals = runpy.run_path(path, run_name="__main__")
    return Recorder.last.scalars, script_globals["agent"]


def run_lab(method, overrides, tmp_path, monkeypatch):
    """The lab runner's ``<method>`` on the same run, eager: (scalars, agent, final.json's dict)."""
    module = load(method)
    built = []

    class RecordedAgent(module.Agent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    kw = dict(total_timesteps=768, num_steps=256, minibatch_size=64, tensorboard=True)
    kw.update(eval_episodes=EVAL_EPISODES, checkpoint_every=0, **overrides)
    with monkeypatch.context() as m:
        m.setattr("torch.utils.tensorboard.SummaryWriter", Recorder)
        m.setattr(module, "Agent", RecordedAgent)
        final = module.main(small_args(module, tmp_path, "lab", **kw))
    return Recorder.last.scalars, built[0], final


def compare(method, script, lab, extra=()):
    """Asserts that the script's run is the runner's: episodes, per-iteration metrics, final parameters and
    the deterministic evaluation's mean return."""
    (s, s_agent), (lab_scalars, lab_agent, lab_final) = script, lab
    for tag in ("charts/episodic_return", "charts/episodic_length"):
        assert s[tag] == lab_scalars[tag] and len(s[tag]) > 0, tag
    names = {**SHARED, **OWN[method], **dict(extra)}
    for mine, theirs in names.items():
        assert len(s[mine]) == 3, mine  # one value per iteration, at the same global steps
        assert s[mine] == lab_scalars[theirs], (mine, s[mine], lab_scalars[theirs])
    lab_state = lab_agent.state_dict()
    for name, tensor in s_agent.state_dict().items():
        assert torch.equal(tensor, lab_state[name]), name
    assert len(lab_final["eval_episodes"]) == EVAL_EPISODES
    assert s["eval/episodic_return"] == [(768, lab_final["eval_return_mean"])], s["eval/episodic_return"]


CASES = [
    ("ppo", [], {}, ()),
    ("rgpo", [], {}, ()),
    ("trpo", [], {}, ()),
    ("awr", [], {}, ()),
    ("ppo", ["--policy-lag", "2", "--decoupled"], dict(policy_lag=2, decoupled=True), STALE.items()),
    ("rgpo", ["--policy-lag", "2", "--decoupled"], dict(policy_lag=2, decoupled=True), STALE.items()),
]


@pytest.mark.parametrize(
    "method,flags,overrides,extra", CASES, ids=["ppo", "rgpo", "trpo", "awr", "ppo-lag2-dec", "rgpo-lag2-dec"]
)
def test_script_and_lab_runner_train_identically(method, flags, overrides, extra, tmp_path, monkeypatch):
    script = run_script(method, [*SHORT, "--num-minibatches", "4", *flags], tmp_path / "script", monkeypatch)
    lab = run_lab(method, overrides, tmp_path, monkeypatch)
    compare(method, script, lab, extra)


def test_ppo_kl_penalty_script_and_lab_runner_train_identically(tmp_path, monkeypatch):
    """PPO with RGPO's KL penalty and backstop (the policy_lag_confirm arm), stale and decoupled."""
    flags = [
        "--num-minibatches",
        "4",
        "--policy-lag",
        "2",
        "--decoupled",
        "--kl-penalty",
        "--kl-target",
        "0.002",
    ]
    script = run_script("ppo", [*SHORT, *flags], tmp_path / "script", monkeypatch)
    overrides = dict(policy_lag=2, decoupled=True, kl_penalty=True, kl_target=0.002)
    lab = run_lab("ppo", overrides, tmp_path, monkeypatch)
    compare("ppo", script, lab, [*STALE.items(), *KL_PENALTY.items()])
    assert len({beta for _, beta in script[0]["ppo/kl_coef"]}) > 1  # the controller moved beta


@pytest.mark.parametrize(
    "method,flag,field",
    [("ppo", "--target-kl", "target_kl"), ("rgpo", "--kl-backstop", "kl_backstop")],
)
def test_early_stops_agree(method, flag, field, tmp_path, monkeypatch):
    """PPO's --target-kl and RGPO's KL backstop, set where they stop the epoch loop early."""
    script = run_script(
        method, [*SHORT, "--num-minibatches", "4", flag, "0.004"], tmp_path / "s", monkeypatch
    )
    lab = run_lab(method, {field: 0.004}, tmp_path, monkeypatch)
    compare(method, script, lab)
    assert min(epochs for _, epochs in script[0][f"{method}/epochs"]) < 10


def test_the_comparison_fails_on_another_seed(tmp_path, monkeypatch):
    """The check can fail: the script on seed 2 against the runner on seed 1."""
    script = run_script(
        "rgpo", [*SHORT, "--num-minibatches", "4", "--seed", "2"], tmp_path / "s", monkeypatch
    )
    lab = run_lab("rgpo", {}, tmp_path, monkeypatch)
    with pytest.raises(AssertionError):
        compare("rgpo", script, lab)
    assert not torch.equal(script[1].actor_logstd, lab[1].actor_logstd) or not torch.equal(
        script[1].actor_mean[0].weight, lab[1].actor_mean[0].weight
    )
