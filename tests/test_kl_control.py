"""Adaptive KL controller: the paper's doubling / halving rule (Eq. beta_update) and its bounds."""

import pytest

from rgpo_trl import AdaptiveKLController


def _reference_rule(beta, kl, target=0.02, lo=0.01, hi=5.0):
    if kl >= 1.5 * target:
        return min(2 * beta, hi)
    if kl <= target / 1.5:
        return max(beta / 2, lo)
    return beta


def test_scripted_kl_sequence_follows_rule_and_bounds():
    ctl = AdaptiveKLController(init=0.5, target=0.02, min=0.01, max=5.0)
    # high KL: 0.5 -> 1 -> 2 -> 4 -> 5 (capped) -> 5; in band: unchanged; low KL: halves to 0.01 floor
    script = [0.03, 0.05, 0.1, 1.0, 0.2, 0.02, 0.0134, 0.029, 0.0133, 0.001, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
              0.0, 0.0, 0.0, 0.0]
    expected = [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0, 5.0, 2.5, 1.25, 0.625, 0.3125, 0.15625, 0.078125,
                0.0390625, 0.01953125, 0.01, 0.01, 0.01, 0.01]
    beta = 0.5
    for kl, exp in zip(script, expected, strict=True):
        beta_ref = _reference_rule(beta, kl)
        beta = ctl.update(kl)
        assert beta == pytest.approx(exp) == beta_ref
        assert ctl.value == beta
    assert ctl.num_updates == len(script)


def test_thresholds_are_inclusive():
    ctl = AdaptiveKLController(init=1.0, target=0.02)
    assert ctl.update(1.5 * 0.02) == 2.0
    ctl = AdaptiveKLController(init=1.0, target=0.02)
    assert ctl.update(0.02 / 1.5) == 0.5


def test_state_dict_round_trip():
    ctl = AdaptiveKLController()
    for kl in (0.1, 0.1, 0.0):
        ctl.update(kl)
    other = AdaptiveKLController()
    other.load_state_dict(ctl.state_dict())
    assert other.value == ctl.value == 1.0 and other.num_updates == 3
    assert other.update(0.1) == ctl.update(0.1) == 2.0


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"target": 0.0}, "target"),
        ({"target": -0.1}, "target"),
        ({"init": 0.0}, "init"),
        ({"min": 1.0, "init": 0.5}, "min <= init"),
        ({"init": 6.0, "max": 5.0}, "init <= max"),
        ({"min": -1.0}, "min"),
        ({"max": float("inf")}, "max"),
    ],
)
def test_invalid_controller_parameters_raise(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AdaptiveKLController(**kwargs)


def test_invalid_kl_and_state_raise():
    ctl = AdaptiveKLController()
    with pytest.raises(ValueError, match="mean_kl"):
        ctl.update(float("nan"))
    with pytest.raises(ValueError, match="outside"):
        ctl.load_state_dict({"value": 10.0})
