"""A gate defined here, registered with `register_gate`, works wherever a built-in gate does: `make_gate`,
`RGPOConfig` (validation from its declared parameters), `RGPOTrainer` and the MuJoCo RGPO script."""

from __future__ import annotations

import math

import pytest
import torch
from _mujoco_utils import SHORT, run_script

import rgpo_trl
from rgpo_trl import GATES, Gate, GateParam, describe_gates, make_gate, register_gate, rgpo_loss


@register_gate("half_tanh")
class HalfTanhGate(Gate):
    """g(r) = (1 + tanh(a (r - 1))) / 2, w(r) = a/2 (1 - tanh^2(a (r - 1))) r. (= sigmoid(2a (r - 1)).)"""

    params = {"a": GateParam(2.0, "slope a", high=50.0, high_open=False)}
    calls = 0

    def g(self, log_r):
        type(self).calls += 1
        return 0.5 * (1.0 + torch.tanh(self.a * torch.expm1(log_r)))

    def w(self, log_r):
        t = torch.tanh(self.a * torch.expm1(log_r))
        return 0.5 * self.a * (1.0 - t * t) * torch.exp(log_r)


def test_registered_gate_is_built_validated_and_described():
    gate = make_gate("half_tanh", a=3.0)
    assert isinstance(gate, HalfTanhGate) and gate.a == 3.0 and GATES["half_tanh"] is HalfTanhGate
    assert make_gate("half_tanh").a == 2.0 and "half_tanh(a=2 in (0, 50])" in describe_gates()
    log_r = torch.linspace(-3, 3, 101, dtype=torch.float64, requires_grad=True)
    (dg,) = torch.autograd.grad(gate.g(log_r).sum(), log_r)
    torch.testing.assert_close(gate.w(log_r.detach()), dg)  # its closed-form w is the derivative
    with pytest.raises(ValueError, match=r"gate 'half_tanh': a must be a finite number in \(0, 50\]"):
        make_gate("half_tanh", a=51.0)
    with pytest.raises(ValueError, match=r"accepts parameters \['a'\]"):
        make_gate("half_tanh", k=1.0)
    with pytest.raises(ValueError, match="already registered"):
        register_gate("half_tanh")(type("Other", (Gate,), {}))
    with pytest.raises(ValueError, match="half_tanh"):  # unknown names list the registered ones
        make_gate("nope")
    # the same validation without building a gate (what a config does)
    assert rgpo_trl.check_gate("half_tanh") == {"a": 2.0}
    assert rgpo_trl.check_gate("half_tanh", a=3) == {"a": 3.0}
    for name, params in (("half_tanh", {"a": 51.0}), ("half_tanh", {"k": 1.0}), ("nope", {})):
        with pytest.raises(ValueError) as built:
            make_gate(name, **params)
        with pytest.raises(ValueError) as checked:
            rgpo_trl.check_gate(name, **params)
        assert str(checked.value) == str(built.value)


def test_rgpo_config_validates_a_registered_gate(tmp_path):
    from rgpo_trl import RGPOConfig

    config = RGPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, gate="half_tanh", gate_params='{"a": 4}'
    )
    assert config.make_gate().a == 4.0
    with pytest.raises(ValueError, match=r"gate_params: gate 'half_tanh': a must be"):
        RGPOConfig(
            output_dir=str(tmp_path), report_to="none", use_cpu=True, gate="half_tanh", gate_params={"a": -1}
        )


def test_rgpo_trainer_trains_with_a_registered_gate(tmp_path):
    from _trainer_utils import (
        attach_recorder,
        base_args,
        save_tiny_model,
        tiny_dataset,
        tiny_tokenizer,
        vowel_reward,
    )

    from rgpo_trl import RGPOConfig, RGPOTrainer

    torch.set_num_threads(1)
    model_path = save_tiny_model(tmp_path / "model")
    args = RGPOConfig(**base_args(tmp_path / "out", gate="half_tanh", gate_params={"a": 3.0}))
    trainer = RGPOTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )
    records = attach_recorder(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert isinstance(trainer.gate, HalfTanhGate)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    second = records[1]  # the reused batch: r_old != 1
    inputs = second["inputs"]
    common = dict(
        kl_coef=second["kl_coef"],
        ref_logps=inputs["ref_per_token_logps"],
        ref_kl_coef=0.05,
        ratio_mode="dual",
        mask=inputs["completion_mask"],
        normalizer=inputs["num_items_in_batch"].float()
        * args.gradient_accumulation_steps
        / args.steps_per_generation,
    )
    old, adv = inputs["old_per_token_logps"], inputs["advantages"][:, None]
    expected, _ = rgpo_loss(second["logps"], old, adv, make_gate("half_tanh", a=3.0), **common)
    sigmoid, _ = rgpo_loss(second["logps"], old, adv, make_gate("sigmoid"), **common)
    torch.testing.assert_close(second["loss"], expected, atol=1e-5, rtol=0)
    assert (second["loss"] - sigmoid).abs() > 1e-4  # the gate in use is ours, not the default


def test_mujoco_rgpo_script_trains_with_a_registered_gate(tmp_path, monkeypatch):
    """The script run in this process (as the lab's driver runs it), the gate registered above."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("mujoco")
    flags = [*SHORT, "--total-timesteps", "512", "--num-minibatches", "4", "--eval-episodes", "0"]
    HalfTanhGate.calls = 0
    tanh, _ = run_script(
        "rgpo", [*flags, "--gate", "half_tanh", "--gate-params", "a", "3"], tmp_path, monkeypatch
    )
    assert HalfTanhGate.calls >= 2 * 4 * 10  # every mini-batch step of both iterations
    sigmoid, _ = run_script("rgpo", flags, tmp_path / "sigmoid", monkeypatch)
    returns = [ret for _, ret in tanh["charts/episodic_return"]]
    assert all(map(math.isfinite, returns)) and tanh["losses/policy_loss"] != sigmoid["losses/policy_loss"]
    assert rgpo_trl.make_gate("half_tanh").a == 2.0


def test_a_gate_with_checks_in_its_own_init_is_refused_by_the_config():
    """check_gate (the configs' validation) runs a registered gate's own __init__ checks, not only its
    declared parameter ranges, so a bad value fails when RGPOConfig is built, not later in the trainer."""

    @register_gate("even_k_for_test")
    class EvenKGate(Gate):
        params = {"k": GateParam(2.0, "sharpness, even")}

        def __init__(self, **params):
            super().__init__(**params)
            if self.k % 2:
                raise ValueError(f"gate 'even_k_for_test': k must be even, got {self.k}")

        def g(self, log_r):
            return torch.sigmoid(self.k * (log_r.exp() - 1.0))

    from rgpo_trl import RGPOConfig
    from rgpo_trl.core import check_gate

    try:
        assert check_gate("even_k_for_test", k=4.0) == {"k": 4.0}
        with pytest.raises(ValueError, match="k must be even, got 3"):
            check_gate("even_k_for_test", k=3.0)
        with pytest.raises(ValueError, match="k must be even"):
            RGPOConfig(output_dir="/tmp/unused", gate="even_k_for_test", gate_params={"k": 3.0}, beta=0.0)
    finally:
        GATES.pop("even_k_for_test", None)
