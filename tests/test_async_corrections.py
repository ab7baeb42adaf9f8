"""Sampler/trainer mismatch in the asynchronous trainer (issue 47): each off-policy correction's loss in
compute_loss against a float64 closed form, the sampler options (bf16, int8, logit noise, top-p) reporting
their own log-probs, the mismatch metrics, and settings refused by name."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

warnings.filterwarnings("ignore", message=".*trl.experimental.*")

from _async_utils import config, packed_batch, step_logs, trainer_with_worker  # noqa: E402

from rgpo_trl.async_rgpo import InProcessRolloutWorker  # noqa: E402
from rgpo_trl.sampler import sampled_log_probs  # noqa: E402
from rgpo_trl.testing import tiny_dataset, tiny_tokenizer, vowel_reward  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def _weights(name, r, adv, per_sample_r):
    if name == "ignore":
        return torch.ones_like(r)
    if name == "tis":
        return r.clamp(max=2.0)
    if name == "icepop":
        return torch.where((r >= 0.5) & (r <= 5.0), r, 0 * r)
    if name == "seq_mask":
        s = torch.exp(torch.log(per_sample_r).sum())
        return torch.full_like(r, 0.0 if s > 3.0 else float(s))
    raise KeyError(name)


@pytest.mark.parametrize("name", ["ignore", "ppo_clip", "tis", "icepop", "seq_mask"])
def test_compute_loss_of_each_correction_equals_the_float64_closed_form(name, model_path, tmp_path):
    """sum over trained tokens of the correction's per-token loss, divided by the trained tokens and the
    accumulation steps, with sequences taken from the packed row's segments."""
    args = config(tmp_path, off_policy_correction=name)
    trainer, _ = trainer_with_worker(model_path, args)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    batch, samples = packed_batch(model_path, trainer, noise=0.6)
    loss = trainer.compute_loss(trainer.model, batch)
    total, n, weights = 0.0, 0, []
    for lp, sample in samples:
        old = torch.tensor(sample["old_log_probs"][3:], dtype=torch.float64)
        r = torch.exp(lp - old)
        a = sample["advantage"]
        if name == "ppo_clip":  # the loss's value, not its weight
            per_token = -torch.minimum(r * a, r.clamp(0.8, 1.2) * a)
        elif name in ("ignore", "seq_mask"):  # -w * r_self * A with r_self = 1 in value
            per_token = -_weights(name, r, a, r) * a
        else:  # -sg(w) A log pi
            per_token = -_weights(name, r, a, r) * a * lp
        weights.append(_weights(name, r, a, r) if name != "ppo_clip" else r)
        total += per_token.sum().item()
        n += len(lp)
    assert loss.item() == pytest.approx(total / n / args.gradient_accumulation_steps, rel=1e-5, abs=1e-7)
    if name in ("icepop", "seq_mask"):  # the noise puts some tokens / sequences outside the box
        w = torch.cat(weights)
        assert 0 < (w == 0).double().mean() < 1
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())


def _worker(model_path, tmp_path, **sampler):
    args = config(tmp_path, **sampler)
    return InProcessRolloutWorker(model_path, tiny_tokenizer(), tiny_dataset(), [vowel_reward], args, lag=1)


def _reported_vs_trainer(worker):
    """One step's samples: the worker's reported log-probs and its float32 copy's forward of the same tokens
    (the trainer's log-probs at these weights), over completion tokens."""
    samples, _ = worker._generate_step(0)
    trainer_logps = worker._behaviour_logprobs([s.input_ids.tolist() for s in samples])
    reported, trainer = [], []
    for s, t in zip(samples, trainer_logps, strict=True):
        m = s.completion_mask.astype(bool)
        reported.append(s.old_log_probs[m])
        trainer.append(t[m])
    return np.concatenate(reported).astype(np.float64), np.concatenate(trainer).astype(np.float64)


def test_the_default_sampler_reports_the_float32_forward(model_path, tmp_path):
    mu, pi = _reported_vs_trainer(_worker(model_path, tmp_path))
    np.testing.assert_array_equal(mu, pi)


@pytest.mark.parametrize(
    "sampler,low,high",
    [
        ({"sampler_dtype": "bfloat16"}, 1e-4, 0.2),
        ({"sampler_quantization": "int8"}, 1e-4, 0.5),
        ({"sampler_logit_noise": 1.0}, 0.2, 5.0),
    ],
)
def test_a_mismatched_sampler_reports_its_own_log_probs(sampler, low, high, model_path, tmp_path):
    """bf16, int8 and logit noise: the reported log-probs are finite, differ from the trainer's by a mean
    |delta log p| in the dose's range, and are a proper distribution's (each <= 0)."""
    mu, pi = _reported_vs_trainer(_worker(model_path, tmp_path, **sampler))
    delta = np.abs(mu - pi)
    assert np.isfinite(mu).all() and (mu <= 1e-6).all()
    assert low < delta.mean() < high, delta.mean()


def test_top_p_in_the_sampler_only_makes_every_ratio_at_most_one(model_path, tmp_path):
    """Nucleus sampling renormalises over the kept tokens: mu >= pi for every sampled token, so r <= 1,
    with equality only where the nucleus kept everything."""
    mu, pi = _reported_vs_trainer(_worker(model_path, tmp_path, sampler_top_p=0.5))
    assert (pi <= mu + 1e-5).all()
    assert (mu - pi > 1e-3).mean() > 0.3


def test_sampled_log_probs_are_the_log_softmax_of_the_scores():
    g = torch.Generator().manual_seed(0)
    scores = tuple(torch.randn(3, 7, generator=g) for _ in range(4))
    scores[1][0, 2] = -torch.inf  # a token top-p removed
    tokens = torch.tensor([[1, 3, 0, 6], [2, 2, 2, 2], [6, 5, 4, 3]])
    out = sampled_log_probs(scores, tokens)
    for b in range(3):
        for t in range(4):
            expected = torch.log_softmax(scores[t][b].double(), -1)[tokens[b, t]]
            assert out[b, t].item() == pytest.approx(expected.item(), abs=1e-5)


def test_training_with_a_correction_under_noise_logs_the_mismatch(model_path, tmp_path):
    """lag 1 with sigma 1 noise and tis: the mismatch metrics describe a mismatched sampler (tokens outside
    [0.5, 2], shares nested), the weight never exceeds the cap, RGPO's coefficient is neither used nor
    logged."""
    args = config(tmp_path, max_steps=3, off_policy_correction="tis", sampler_logit_noise=1.0)
    trainer, _ = trainer_with_worker(model_path, args, lag=1)
    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 3
    for log in logs:
        assert 0 < log["mismatch/outside_0.5_2"] <= log["mismatch/outside_0.9_1.1"] <= 1
        assert log["mismatch/abs_log_ratio_mean"] > 0.2 and log["rgpo/ratio_old_max"] > 2
        assert 0 < log["correction/weight_max"] <= 2.0 + 1e-6 and "rgpo/kl_coef" not in log
        assert np.isfinite(log["loss"])
    assert trainer.kl_ctl.kl_coef == 0.5  # untouched: tis does not read it


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"off_policy_correction": "vtrace"}, "off_policy_correction must be one of"),
        (
            {"off_policy_correction": "tis", "correction_params": {"cap": 0.5}},
            r"cap must be a number in \[1.0",
        ),
        (
            {"off_policy_correction": "tis", "kl_coef": 0.1},
            "kl_coef only apply with off_policy_correction='rgpo'",
        ),
        ({"off_policy_correction": "icepop", "beta": 0.05}, "beta only apply with"),
        ({"correction_params": "{cap"}, "correction_params must be a JSON object"),
        ({"sampler_dtype": "float16"}, r"sampler_dtype must be one of \['float32', 'bfloat16'\]"),
        ({"sampler_quantization": "int4"}, "sampler_quantization must be one of"),
        ({"sampler_quantization": "int8", "sampler_dtype": "bfloat16"}, "leave sampler_dtype at"),
        ({"sampler_logit_noise": -0.1}, "sampler_logit_noise must be a finite number >= 0"),
        ({"sampler_top_p": 0.0}, r"sampler_top_p must be in \(0, 1\]"),
    ],
)
def test_bad_settings_are_refused_at_config_time_by_name(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **overrides)


def test_ppo_clip_arm_is_trls_async_grpo_loss(model_path, tmp_path):
    """The ppo_clip correction on AsyncRGPOTrainer gives AsyncGRPOTrainer's loss on the same packed batch (one
    code path runs every arm of the mismatch study, and its ppo_clip arm is TRL's trainer as it is)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from rgpo_trl.async_rgpo import InProcessWeightTransfer

    ours, _ = trainer_with_worker(model_path, config(tmp_path / "a", off_policy_correction="ppo_clip"))
    base = config(tmp_path / "b").to_dict()
    trl_fields = {k: v for k, v in base.items() if k in AsyncGRPOConfig.__dataclass_fields__}
    trl_args = AsyncGRPOConfig(**{**trl_fields, "output_dir": str(tmp_path / "trl")})
    worker = InProcessRolloutWorker(
        model_path, tiny_tokenizer(), tiny_dataset(), [vowel_reward], trl_args, lag=2
    )
    theirs = AsyncGRPOTrainer(
        model_path,
        args=trl_args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        rollout_worker=worker,
        weight_transfer=InProcessWeightTransfer(worker),
    )
    batch, _ = packed_batch(model_path, ours, noise=0.5)
    losses = []
    for trainer in (ours, theirs):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 2
        losses.append(trainer.compute_loss(trainer.model, batch))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-8)
    assert abs(losses[0].item()) > 1e-4
