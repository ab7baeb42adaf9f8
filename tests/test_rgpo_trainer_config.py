"""RGPOConfig: paper defaults, help metadata, and ValueError (naming the field) for invalid or contradictory
settings. No model is built here."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import HfArgumentParser
from trl import GRPOConfig

from rgpo_trl import RGPOConfig
from rgpo_trl.core.gates import SigmoidGate

RGPO_FIELDS = [
    "gate",
    "gate_params",
    "ratio_mode",
    "kl_coef",
    "kl_target",
    "kl_coef_min",
    "kl_coef_max",
    "kl_controller",
    "beta",
    "num_iterations",
    "loss_type",
    "use_bias_correction_kl",
]


def make(tmp_path, **kwargs) -> RGPOConfig:
    return RGPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kwargs)


def test_paper_defaults(tmp_path):
    config = make(tmp_path)
    assert isinstance(config, GRPOConfig)
    assert (config.gate, config.gate_params, config.ratio_mode) == ("sigmoid", {}, "dual")
    assert (config.kl_coef, config.kl_target, config.kl_coef_min, config.kl_coef_max) == (
        0.5,
        0.02,
        0.01,
        5.0,
    )
    assert config.kl_controller == "adaptive"
    assert config.beta == 0.05
    assert config.num_iterations == 2
    assert config.loss_type == "dapo"
    assert config.use_bias_correction_kl is False
    gate = config.make_gate()
    assert isinstance(gate, SigmoidGate) and gate.param_values == {"k": 5.0}


def test_every_rgpo_field_has_help(tmp_path):
    fields = {f.name: f for f in dataclasses.fields(RGPOConfig)}
    for name in RGPO_FIELDS:
        assert fields[name].metadata.get("help"), name
    assert "dapo" in fields["loss_type"].metadata["help"]


@pytest.mark.parametrize(
    ("gate", "gate_params", "params"),
    [
        ("sigmoid", {"k": 3.0}, {"k": 3.0}),
        ("clipped_linear", {"c": 1.5}, {"c": 1.5}),
        ("temperature", {"temperature": 2.0}, {"temperature": 2.0}),
        ("ppo_clip", '{"eps": 0.1}', {"eps": 0.1}),  # a JSON string, as from the command line
        ("ppo_clip", {}, {"eps": 0.2}),  # the declared default
        ("is", None, {}),
    ],
)
def test_make_gate_uses_gate_params(tmp_path, gate, gate_params, params):
    config = make(tmp_path, gate=gate, gate_params=gate_params)
    built = config.make_gate()
    assert built.name == gate and built.param_values == params


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gate": "tanh"}, "gate"),
        (
            {"gate_params": {"k": 0.0}},
            r"gate_params: gate 'sigmoid': k must be a finite number in \(0, inf\)",
        ),
        (
            {"gate": "clipped_linear", "gate_params": {"c": -1.0}},
            r"gate_params: .* c must be .* in \(0, inf\)",
        ),
        ({"gate": "temperature", "gate_params": {"temperature": float("nan")}}, "gate_params: .*temperature"),
        ({"gate": "ppo_clip", "gate_params": {"eps": 1.5}}, r"gate_params: .*eps must be .* in \(0, 1\)"),
        ({"gate": "is", "gate_params": {"k": 5.0}}, r"gate_params: gate 'is' accepts parameters \[\]"),
        ({"gate_params": "k=5"}, "gate_params must be a JSON object"),
        ({"kl_controller": "pid"}, "kl_controller"),
        ({"ratio_mode": "both"}, "ratio_mode"),
        ({"kl_coef": 0.0}, "kl_coef"),
        ({"kl_coef": 10.0}, "kl_coef"),
        ({"kl_target": -0.02}, "kl_target"),
        ({"kl_coef_min": 1.0, "kl_coef_max": 0.5}, "kl_coef_min"),
        ({"kl_coef_max": float("inf")}, "kl_coef_max"),
        ({"beta": -0.1}, "beta"),
        ({"beta": 0.0}, "beta"),  # with the default ratio_mode="dual"
        ({"beta": 0.0, "ratio_mode": "ref"}, "beta"),
        ({"num_iterations": 0}, "num_iterations"),
        (
            {"loss_type": "cispo"},
            "loss_type='cispo' is not supported by RGPOTrainer \\(it is a surrogate loss",
        ),
        ({"loss_type": "sapo"}, "loss_type='sapo' .*replaces the gate"),
        ({"loss_type": "vespo"}, "loss_type='vespo' .*replaces the gate"),
        ({"loss_type": "luspo"}, "loss_type='luspo' .*replaces the gate"),
        ({"loss_type": "nope"}, "loss_type='nope' .*unknown"),
        ({"epsilon": 0.3}, "epsilon=0.3 is not supported by RGPOTrainer: GRPO's clipping range"),
        ({"epsilon_high": 0.28}, "epsilon_high=0.28 is not supported"),
        ({"sapo_temperature_pos": 2.0}, "sapo_temperature_pos=2.0 .*only loss_type='sapo' reads it"),
        ({"vespo_k_pos": 1.0}, "vespo_k_pos=1.0 .*only loss_type='vespo' reads it"),
        ({"importance_sampling_level": "batch"}, "importance_sampling_level"),
        ({"delta": 1.5}, "delta=1.5 is not supported by RGPOTrainer: two-sided clipping"),
    ],
)
def test_invalid_or_contradictory_values_raise_naming_the_field(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        make(tmp_path, **kwargs)


def test_beta_zero_is_allowed_with_the_old_ratio(tmp_path):
    config = make(tmp_path, beta=0.0, ratio_mode="old")
    assert config.beta == 0.0


def test_sequence_level_is_accepted(tmp_path):
    assert make(tmp_path, importance_sampling_level="sequence").importance_sampling_level == "sequence"


def test_command_line_parsing(tmp_path):
    (config,) = HfArgumentParser(RGPOConfig).parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--ratio_mode",
            "old",
            "--gate_params",
            '{"k": 3}',
            "--kl_controller",
            "fixed",
            "--kl_target",
            "0.05",
            "--report_to",
            "none",
            "--use_cpu",
            "true",
        ]
    )
    assert (config.ratio_mode, config.gate_params, config.kl_target, config.beta) == (
        "old",
        {"k": 3},
        0.05,
        0.05,
    )
    assert config.make_gate().k == 3.0 and config.make_kl_controller().name == "fixed"
    with pytest.raises(SystemExit):  # argparse `choices` from the field metadata
        HfArgumentParser(RGPOConfig).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--ratio_mode", "both"]
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss_type": "grpo"},
        {"loss_type": "bnpo"},
        {"loss_type": "dr_grpo"},
        {"use_bias_correction_kl": True},
        {"off_policy_mask_threshold": 0.5},
        {"top_entropy_quantile": 0.2},
        {"entropy_coef": 0.01},
        {"use_adaptive_entropy": True},
        {"use_vllm": True, "vllm_importance_sampling_correction": True},
        {"epsilon_high": 0.2},  # equal to epsilon: GRPOConfig's own default, not a change
    ],
)
def test_grpo_options_orthogonal_to_the_gate_keep_their_grpo_meaning(tmp_path, kwargs):
    """RGPOConfig changes nothing GRPOConfig would resolve from the same arguments, except the fields whose
    default RGPO overrides (found from the two dataclasses, not listed here): every other resolved field
    equals GRPOConfig's, so an orthogonal option reaches GRPOTrainer as TRL means it."""
    base = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    ours, trls = RGPOConfig(**base, **kwargs), GRPOConfig(**base, **kwargs)
    grpo_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    overridden = {
        f.name
        for f in dataclasses.fields(RGPOConfig)
        if f.name in grpo_fields and f.default != grpo_fields[f.name].default
    }
    assert {"num_iterations", "use_bias_correction_kl"} <= overridden  # RGPO's documented overrides
    for name in grpo_fields:
        if name in overridden and name not in kwargs:
            assert (
                getattr(ours, name)
                == dataclasses.fields(RGPOConfig)[
                    [f.name for f in dataclasses.fields(RGPOConfig)].index(name)
                ].default
            ), name
        else:
            assert getattr(ours, name) == getattr(trls, name), name


def test_trl_outside_the_tested_range_warns_naming_it():
    import warnings

    from rgpo_trl.trainer.trl_version import TESTED_TRL, check_trl_version

    low, high = TESTED_TRL
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing inside the range
        assert (
            check_trl_version(str(low))
            and check_trl_version(f"{low}.3")
            and check_trl_version(f"{low}.0.dev1")
        )
    for outside in (str(high), "1.15.2", "2.0.0"):
        with pytest.warns(UserWarning, match=rf"tested with trl>={low},<{high}; trl {outside} is installed"):
            assert not check_trl_version(outside)


def test_importing_the_trainers_with_a_faked_trl_version_warns_once(monkeypatch):
    import importlib
    import sys
    import warnings

    import trl

    import rgpo_trl.trainer

    monkeypatch.setattr(rgpo_trl, "trainer", rgpo_trl.trainer)  # restored after the re-import below
    monkeypatch.setattr(trl, "__version__", "9.0.0")
    for name in [m for m in sys.modules if m.startswith("rgpo_trl.trainer")]:
        monkeypatch.delitem(sys.modules, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module("rgpo_trl.trainer")
    messages = [str(w.message) for w in caught if "is installed" in str(w.message)]
    assert len(messages) == 1 and "trl 9.0.0 is installed" in messages[0]
