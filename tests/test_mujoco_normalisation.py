"""The committed normalisation baselines: re-measured episodes equal the committed ones, and the score maps
the low baseline to 0 and the on-policy reference to 1."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from rgpo_lab.mujoco_normalisation import OUT, Normaliser, baseline_returns, reference_return  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def committed():
    with open(os.path.join(OUT, "baselines.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("policy", ["random", "zero"])
def test_baselines_reproduce_the_committed_episodes(committed, policy):
    """The first three Hopper episodes of each baseline, measured again, equal the committed returns."""
    again = baseline_returns("Hopper-v4", policy, episodes=3)
    np.testing.assert_allclose(
        again, committed["environments"]["Hopper-v4"][policy]["returns"][:3], rtol=1e-9
    )


def test_committed_means_and_reference_are_what_their_episodes_and_runs_say(committed):
    for env_id, entry in committed["environments"].items():
        for policy in ("random", "zero"):
            returns = entry[policy]["returns"]
            assert len(returns) == committed["episodes"]
            assert entry[policy]["mean"] == pytest.approx(np.mean(returns), rel=1e-12)
        mean, names = reference_return(os.path.join(ROOT, "results", "mujoco"), env_id)
        assert (
            entry["reference"]["mean"] == pytest.approx(mean, rel=1e-12)
            and entry["reference"]["runs"] == names
        )
        assert len(names) == 10


def test_normalised_score_maps_the_anchors_to_zero_and_one(committed):
    n = Normaliser(committed["environments"])
    for env_id, entry in committed["environments"].items():
        low = max(entry["random"]["mean"], entry["zero"]["mean"])
        high = entry["reference"]["mean"]
        np.testing.assert_allclose(n(env_id, [low, high, (low + high) / 2]), [0.0, 1.0, 0.5], atol=1e-12)
    # standing still on Ant (the zero-action baseline) is the low anchor there, not the random policy
    ant = committed["environments"]["Ant-v4"]
    assert ant["zero"]["mean"] > ant["random"]["mean"] and n.low("Ant-v4") == ant["zero"]["mean"]
    with pytest.raises(KeyError, match="no normalisation baseline"):
        n("Humanoid-v4", [1.0])
    with pytest.raises(ValueError, match="policy must be"):
        baseline_returns("Hopper-v4", "greedy", episodes=1)
