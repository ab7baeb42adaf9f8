"""KL controllers: the paper's doubling / halving rule (Eq. beta_update), its bounds, the fixed one, the
registry."""

import pytest
from _references import paper_rule

from rgpo_trl import KL_CONTROLLERS, AdaptiveKLController, FixedKLController, make_kl_controller


def test_scripted_kl_sequence_follows_rule_and_bounds():
    ctl = AdaptiveKLController(kl_coef=0.5, kl_target=0.02, kl_coef_min=0.01, kl_coef_max=5.0)
    # high KL: 0.5 -> 1 -> 2 -> 4 -> 5 (capped) -> 5; in band: unchanged; low KL: halves to 0.01 floor
    script = [
        0.03,
        0.05,
        0.1,
        1.0,
        0.2,
        0.02,
        0.0134,
        0.029,
        0.0133,
        0.001,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]
    expected = [
        1.0,
        2.0,
        4.0,
        5.0,
        5.0,
        5.0,
        5.0,
        5.0,
        2.5,
        1.25,
        0.625,
        0.3125,
        0.15625,
        0.078125,
        0.0390625,
        0.01953125,
        0.01,
        0.01,
        0.01,
        0.01,
    ]
    beta = 0.5
    for kl, exp in zip(script, expected, strict=True):
        beta_ref = paper_rule(beta, kl)
        beta = ctl.update(kl)
        assert beta == pytest.approx(exp) == beta_ref
        assert ctl.kl_coef == beta
    assert ctl.num_updates == len(script)


def test_thresholds_are_inclusive():
    ctl = AdaptiveKLController(kl_coef=1.0, kl_target=0.02)
    assert ctl.update(1.5 * 0.02) == 2.0
    ctl = AdaptiveKLController(kl_coef=1.0, kl_target=0.02)
    assert ctl.update(0.02 / 1.5) == 0.5


def test_state_dict_round_trip():
    ctl = AdaptiveKLController()
    for kl in (0.1, 0.1, 0.0):
        ctl.update(kl)
    other = AdaptiveKLController()
    other.load_state_dict(ctl.state_dict())
    assert other.kl_coef == ctl.kl_coef == 1.0 and other.num_updates == 3
    assert other.update(0.1) == ctl.update(0.1) == 2.0


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"kl_target": 0.0}, "kl_target"),
        ({"kl_target": -0.1}, "kl_target"),
        ({"kl_coef": 0.0}, "kl_coef"),
        ({"kl_coef_min": 1.0, "kl_coef": 0.5}, r"kl_coef must lie in \[kl_coef_min"),
        ({"kl_coef": 6.0, "kl_coef_max": 5.0}, r"kl_coef must lie in \[kl_coef_min, kl_coef_max\]"),
        ({"kl_coef_min": -1.0}, "kl_coef_min"),
        ({"kl_coef_max": float("inf")}, "kl_coef_max"),
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
        ctl.load_state_dict({"controller": "adaptive", "kl_coef": 10.0, "num_updates": 1})
    with pytest.raises(ValueError, match="does not match"):
        ctl.load_state_dict(FixedKLController(0.5).state_dict())
    with pytest.raises(ValueError, match="num_updates"):
        ctl.load_state_dict({"controller": "adaptive", "kl_coef": 1.0, "num_updates": -2})
    before = ctl.state_dict()
    with pytest.raises(ValueError):
        ctl.load_state_dict({"controller": "adaptive", "kl_coef": 1.0})  # nothing is half-loaded
    assert ctl.state_dict() == before


def test_fixed_controller_and_registry():
    ctl = make_kl_controller("fixed", kl_coef=0.3, kl_target=0.02, kl_coef_min=0.01, kl_coef_max=5.0)
    assert isinstance(ctl, FixedKLController)
    assert [ctl.update(kl) for kl in (0.0, 1.0, 0.02)] == [0.3, 0.3, 0.3] and ctl.num_updates == 3
    adaptive = make_kl_controller("adaptive", kl_coef=0.5, kl_target=0.02, kl_coef_min=0.01, kl_coef_max=5.0)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.update(1.0) == 1.0
    assert set(KL_CONTROLLERS) >= {"adaptive", "fixed"}
    with pytest.raises(ValueError, match="kl_controller must be one of"):
        make_kl_controller("pid")


# ------------------------------------------------------------------------------------------------ checkpoints
def test_checkpoint_helpers_round_trip_and_refuse_naming_the_file(tmp_path):
    """The file both trainers write: saved and restored exactly; a missing file warns and leaves the
    controller as it is; a corrupt, non-object or mismatched file raises naming the file, controller
    unchanged."""
    import json
    import re

    from rgpo_trl.trainer.checkpoint import KL_CONTROLLER_FILE, load_kl_controller, save_kl_controller

    ctl = AdaptiveKLController(kl_coef=0.5)
    ctl.update(1.0)
    save_kl_controller(ctl, str(tmp_path))
    path = tmp_path / KL_CONTROLLER_FILE
    restored = AdaptiveKLController(kl_coef=0.5)
    assert load_kl_controller(restored, str(tmp_path)) is True
    assert restored.state_dict() == ctl.state_dict() == json.loads(path.read_text())

    fresh = AdaptiveKLController(kl_coef=0.5)
    missing = re.escape(str(tmp_path / "nope" / KL_CONTROLLER_FILE))
    with pytest.warns(UserWarning, match=f"{missing} not found: the KL-to-behaviour coefficient"):
        assert load_kl_controller(fresh, str(tmp_path / "nope"), "KL-to-behaviour") is False
    cases = {
        "{not json": r"is not valid JSON .*: the checkpoint is corrupt",
        "[1, 2]": "should hold a JSON object, found list",
        json.dumps({**ctl.state_dict(), "controller": "fixed"}): "saved KL controller 'fixed' does not match",
        json.dumps({**ctl.state_dict(), "kl_coef": 50.0}): r"saved kl_coef 50.0 is outside",
        json.dumps({**ctl.state_dict(), "num_updates": -1}): "saved num_updates must be",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message) as err:
            load_kl_controller(fresh, str(tmp_path))
        assert str(path) in str(err.value)
        assert fresh.state_dict() == AdaptiveKLController(kl_coef=0.5).state_dict()


def test_paper_kl_defaults_are_the_one_source_of_every_default():
    """The controller, both trainer configs and the MuJoCo RGPO script default to the paper's values (Sec. 5),
    all read from rgpo_trl.core.PAPER_KL_DEFAULTS."""
    import dataclasses

    from rgpo_trl.async_rgpo.config import AsyncRGPOConfig
    from rgpo_trl.core import PAPER_KL_DEFAULTS, AdaptiveKLController
    from rgpo_trl.trainer.config import RGPOConfig

    assert PAPER_KL_DEFAULTS == {"kl_coef": 0.5, "kl_target": 0.02, "kl_coef_min": 0.01, "kl_coef_max": 5.0}
    controller = AdaptiveKLController()
    for config_class in (RGPOConfig, AsyncRGPOConfig):
        defaults = {
            f.name: f.default for f in dataclasses.fields(config_class) if f.name in PAPER_KL_DEFAULTS
        }
        assert defaults == PAPER_KL_DEFAULTS, config_class.__name__
    assert {name: getattr(controller, name) for name in PAPER_KL_DEFAULTS} == PAPER_KL_DEFAULTS
