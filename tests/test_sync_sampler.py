"""The in-process sampler of the synchronous trainers (rgpo_trl.trainer.sync_sampler): RGPOTrainer and TRL's
GRPOTrainer generate with a sampler installed where TRL keeps vLLM, and TRL's own vLLM code does the rest.

A faithful sampler changes nothing (factor exactly 1, parameters bit-identical to plain generation); a
mismatched one reports log-probs that equal an independent float64 recomputation of its distribution, and
TRL's factor in each mode and its `sampling/*` metrics equal the float64 formulas; RGPO's two designs use
them as written; bad settings are refused in one line."""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
from _trainer_utils import attach_recorder, base_args, tiny_dataset, tiny_tokenizer, vowel_reward
from transformers import AutoModelForCausalLM

from rgpo_trl import GRPOSamplerConfig, GRPOSamplerTrainer, RGPOConfig, RGPOTrainer
from rgpo_trl.sampler import SamplerSettings, sampler_model
from rgpo_trl.trainer.sync_sampler import refuse_int8_off_cpu, refuse_sharded_training

torch.set_num_threads(1)
KINDS = {"rgpo": (RGPOTrainer, RGPOConfig), "grpo": (GRPOSamplerTrainer, GRPOSamplerConfig)}


def _trainer(kind, model_path, tmp_path, **overrides):
    """The tiny trainer in float32 (GRPOConfig's bf16 default would run its forwards under bf16 autocast)."""
    trainer_cls, config_cls = KINDS[kind]
    args = config_cls(**base_args(tmp_path, **{"bf16": False, **overrides}))
    return trainer_cls(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )


def _record_batches(trainer, model_path) -> list[dict]:
    """Per generation batch: a float64 copy of the policy that generated it (a fresh model from the same files
    with the trainer's weights, untouched by TRL's patches) and TRL's output for it."""
    batches, original = [], trainer._generate_and_score_completions

    def wrapped(inputs):
        policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64).eval()
        policy.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
        output = original(inputs)
        batches.append({"policy": policy, "output": {k: v for k, v in output.items()}})
        return output

    trainer._generate_and_score_completions = wrapped
    return batches


def _logits64(policy, output) -> torch.Tensor:
    """Float64 logits predicting each completion token, (B, T, V)."""
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    n = output["completion_ids"].size(1)
    with torch.no_grad():
        return policy(input_ids=ids, attention_mask=mask).logits[:, -n - 1 : -1].double()


def _gather(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, ids[..., None])[..., 0]


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus truncation written out: keep the most likely tokens until their mass reaches top_p (HF's rule:
    drop a token when the mass of the tokens less likely than it, itself included, is <= 1 - top_p)."""
    probs = scores.softmax(-1)
    order = probs.argsort(dim=-1)  # ascending
    mass_up_to = probs.gather(-1, order).cumsum(-1)
    drop_sorted = mass_up_to <= 1 - top_p
    drop_sorted[..., -1] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, -math.inf)


def _sampler_logps64(
    policy, output, sigma: float, top_p: float, seed: int, temperature: float
) -> torch.Tensor:
    """log mu of each completion token in float64: the trainer's logits plus the sampler's noise (replayed
    from its documented generator: seed + 1 + process index, one (rows, vocab) draw per generation step),
    divided by the temperature, truncated to the nucleus."""
    logits = _logits64(policy, output)
    steps = int(output["completion_mask"].sum(-1).max())
    generator = torch.Generator().manual_seed(seed + 1)
    noise = torch.stack([torch.randn(logits[:, 0].shape, generator=generator) for _ in range(steps)], dim=1)
    scores = (logits[:, :steps] + sigma * noise.double()) / temperature
    logp = torch.log_softmax(_top_p(scores, top_p), dim=-1)
    return _gather(logp, output["completion_ids"][:, :steps])


def _trainer_logps64(policy, output, temperature: float) -> torch.Tensor:
    return _gather(torch.log_softmax(_logits64(policy, output) / temperature, -1), output["completion_ids"])


def _logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


# ---------------------------------------------------------------------------------------- faithful sampler
@pytest.mark.parametrize("kind", ["rgpo", "grpo"])
@pytest.mark.parametrize("num_iterations", [1, 2])
def test_a_faithful_sampler_trains_exactly_as_plain_generation(kind, num_iterations, model_path, tmp_path):
    """Every sampler_* at its default: TRL's factor is exactly 1, the sampler's log-probs are the trainer's,
    the completions and the trained parameters are bit-identical to GRPOTrainer's plain generation (the tiny
    model has no dropout)."""
    settings = dict(max_steps=2 * num_iterations, num_iterations=num_iterations, beta=0.0, learning_rate=1e-2)
    if kind == "rgpo":
        settings["ratio_mode"] = "old"
    runs = {}
    for sampler in (False, True):
        trainer = _trainer(
            kind, model_path, tmp_path / str(sampler), use_in_process_sampler=sampler, **settings
        )
        batches = _record_batches(trainer, model_path)
        trainer.train()
        runs[sampler] = (trainer, batches)
    (plain, plain_batches), (sampled, sampled_batches) = runs[False], runs[True]
    assert sampled.use_vllm and not plain.use_vllm
    assert len(sampled_batches) == len(plain_batches) == 2
    for a, b in zip(plain_batches, sampled_batches, strict=True):
        assert torch.equal(a["output"]["completion_ids"], b["output"]["completion_ids"])
        factor = b["output"]["importance_sampling_ratio"]
        assert torch.equal(factor, torch.ones_like(factor))
        mask = b["output"]["completion_mask"].bool()
        assert torch.equal(
            b["output"]["sampling_per_token_logps"][mask], b["output"]["old_per_token_logps"][mask]
        )
    assert _logged(sampled, "sampling/importance_sampling_ratio/min") == [1.0, 1.0]
    assert _logged(sampled, "sampling/sampling_logp_difference/max") == [0.0, 0.0]
    for (name, p), q in zip(plain.model.named_parameters(), sampled.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(plain.model.lm_head.weight, plain_batches[0]["policy"].lm_head.weight.float())


# ---------------------------------------------------------------------------- TRL's factor and metrics
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_trl_factor_and_metrics_equal_a_float64_recomputation(mode, model_path, tmp_path):
    """Logit noise and top-p in the sampler: its reported log-probs, TRL's factor in each mode (cap 3) and the
    logged sampling/* metrics equal float64 recomputations (the trainer's log pi, the sampler's log mu)."""
    sigma, top_p, cap = 0.5, 0.9, 3.0
    trainer = _trainer(
        "grpo",
        model_path,
        tmp_path,
        max_steps=1,
        num_iterations=1,
        beta=0.0,
        use_in_process_sampler=True,
        sampler_logit_noise=sigma,
        sampler_top_p=top_p,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_max=cap,
    )
    batches = _record_batches(trainer, model_path)
    trainer.train()
    (batch,) = batches
    output, policy = batch["output"], batch["policy"]
    mask = output["completion_mask"].bool()
    log_mu = _sampler_logps64(policy, output, sigma, top_p, trainer.args.seed, trainer.temperature)
    log_pi = _trainer_logps64(policy, output, trainer.temperature)[:, : log_mu.size(1)]
    mask = mask[:, : log_mu.size(1)]
    reported = output["sampling_per_token_logps"][:, : log_mu.size(1)].double()
    assert torch.allclose(reported[mask], log_mu[mask], atol=1e-4)
    diff = (log_pi - log_mu) * mask
    assert diff[mask].abs().max() > 0.1  # the sampler differs
    if mode.startswith("sequence"):
        ratio = diff.sum(-1, keepdim=True).exp()
        flat = ratio.flatten()
    else:
        ratio = diff.exp()
        flat = ratio[mask]
    ratio = ratio.clamp(max=cap) if mode.endswith("truncate") else ratio.masked_fill(ratio > cap, 0.0)
    flat = flat.clamp(max=cap) if mode.endswith("truncate") else flat.masked_fill(flat > cap, 0.0)
    factor = output["importance_sampling_ratio"].double()
    assert factor.shape == ratio.shape
    if mode.startswith("token"):
        factor, ratio = factor[:, : ratio.size(1)][mask], ratio[mask]
    assert torch.allclose(factor, ratio, rtol=1e-4, atol=1e-6)
    delta = (log_pi - log_mu).abs()[mask]
    expected = {
        "sampling/sampling_logp_difference/mean": delta.mean(),
        "sampling/sampling_logp_difference/max": delta.max(),
        "sampling/importance_sampling_ratio/min": flat.min(),
        "sampling/importance_sampling_ratio/mean": flat.mean(),
        "sampling/importance_sampling_ratio/max": flat.max(),
    }
    for key, value in expected.items():
        assert _logged(trainer, key) == [pytest.approx(value.item(), rel=1e-4, abs=1e-6)], key


# ---------------------------------------------------------------------------------------- RGPO's two designs
@pytest.mark.parametrize("gate_on_sampler", [False, True])
def test_rgpo_designs_against_the_mismatched_sampler(gate_on_sampler, model_path, tmp_path):
    """Default (decoupled): gate and KL on pi / pi_old, TRL's factor on the gated term. gate_on_sampler
    (coupled): gate and KL on pi / mu, the sampler's own log-probs, no factor. The loss of every
    micro-batch equals the formula written out (with the design's ratio and factor; the other design's
    formula differs)."""
    trainer = _trainer(
        "rgpo",
        model_path,
        tmp_path,
        max_steps=2,
        num_iterations=2,
        beta=0.0,
        ratio_mode="old",
        use_in_process_sampler=True,
        sampler_logit_noise=0.5,
        gate_on_sampler=gate_on_sampler,
    )
    records = attach_recorder(trainer)
    trainer.train()
    assert len(records) == 2  # one generation batch, used twice

    def expected_loss(record, coupled: bool) -> torch.Tensor:
        inputs, logps = record["inputs"], record["logps"].double()
        mask = inputs["completion_mask"].double()
        behaviour = inputs["sampling_per_token_logps" if coupled else "old_per_token_logps"].double()
        log_r = logps - behaviour
        r = log_r.exp()
        policy = -torch.sigmoid(5.0 * (r - 1)) * inputs["advantages"].double()[:, None]
        if not coupled:
            policy = policy * inputs["importance_sampling_ratio"].double()
        per_token = policy + record["kl_coef"] * (r - 1 - log_r)
        normalizer = inputs["num_items_in_batch"].double() * trainer.args.gradient_accumulation_steps
        return (per_token * mask).sum() / (normalizer / trainer.args.steps_per_generation)

    for record in records:
        ours, other = expected_loss(record, gate_on_sampler), expected_loss(record, not gate_on_sampler)
        assert record["loss"].item() == pytest.approx(ours.item(), abs=1e-5)
        assert abs(ours.item() - other.item()) > 1e-3  # the two designs give different losses here


# ---------------------------------------------------------------------------------------- bf16 / int8 copies
@pytest.mark.parametrize("dtype,quantization", [("bfloat16", "none"), ("float32", "int8")])
def test_a_low_precision_copy_is_synced_and_reports_its_own_log_probs(
    dtype, quantization, model_path, tmp_path
):
    """The sampler's bf16 / int8 copy is refreshed at each weight sync (after training it computes exactly
    what a fresh copy of the weights of the last generation computes, not what a copy of the initial ones
    does), its reported log-probs are close to a full forward of such a copy (the sampler's cached decoding
    differs in rounding only) and differ from the trainer's."""
    trainer = _trainer(
        "grpo",
        model_path,
        tmp_path,
        max_steps=2,
        num_iterations=1,
        beta=0.0,
        learning_rate=5e-2,
        use_in_process_sampler=True,
        sampler_dtype=dtype,
        sampler_quantization=quantization,
    )
    batches = _record_batches(trainer, model_path)
    trainer.train()
    settings = SamplerSettings(dtype=dtype, quantization=quantization)

    def fresh_copy(policy):
        return sampler_model(copy.deepcopy(policy).float(), settings).eval()

    def copy_logps(model, output):
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        n = output["completion_ids"].size(1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[:, -n - 1 : -1].float()
        return _gather(torch.log_softmax(logits / trainer.temperature, -1), output["completion_ids"]).double()

    for batch in batches:
        output = batch["output"]
        mask = output["completion_mask"].bool()
        reported = output["sampling_per_token_logps"].double()[mask]
        fresh = copy_logps(fresh_copy(batch["policy"]), output)[mask]
        trainer_logps = _trainer_logps64(batch["policy"], output, trainer.temperature)[mask]
        assert (reported - fresh).abs().mean() < 0.01 and (reported - fresh).abs().max() < 0.1
        assert (reported - trainer_logps).abs().max() > 1e-3  # a real mismatch
    probe = torch.tensor([[10, 17, 25, 29, 6, 17, 29, 11, 29, 15, 32, 5, 25, 25]])
    with torch.no_grad():
        synced = trainer.vllm_generation.copy(input_ids=probe).logits
        last = fresh_copy(batches[-1]["policy"])(input_ids=probe).logits
        first = fresh_copy(batches[0]["policy"])(input_ids=probe).logits
    assert torch.equal(synced, last)
    assert not torch.equal(synced, first)


# ---------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"use_in_process_sampler": 1}, "use_in_process_sampler must be True or False, got 1"),
        ({"sampler_logit_noise": 0.5}, "sampler_logit_noise set the in-process sampler"),
        (
            {"use_in_process_sampler": True, "sampler_logit_noise": True},
            "sampler_logit_noise must be a finite",
        ),
        ({"use_in_process_sampler": True, "sampler_top_p": False}, r"sampler_top_p must be in \(0, 1\]"),
        ({"use_in_process_sampler": True, "sampler_top_p": 1.5}, r"sampler_top_p must be in \(0, 1\]"),
        ({"use_in_process_sampler": True, "sampler_dtype": "float16"}, "sampler_dtype must be one of"),
        ({"use_in_process_sampler": True, "use_vllm": True}, "set use_vllm=False"),
        (
            {"use_in_process_sampler": True, "use_transformers_continuous_batching": True},
            "set use_transformers_continuous_batching=False",
        ),
        ({"use_in_process_sampler": True, "use_transformers_paged": True}, "use_transformers_paged=False"),
        ({"use_in_process_sampler": True, "top_p": 0.9}, "top_p=0.9 is not supported with use_in_process"),
        ({"use_in_process_sampler": True, "repetition_penalty": 1.1}, "repetition_penalty=1.1 is not"),
        (
            {"use_in_process_sampler": True, "sampler_quantization": "int8", "sampler_dtype": "bfloat16"},
            "leave sampler_dtype at 'float32'",
        ),
    ],
)
@pytest.mark.parametrize("config_cls", [RGPOConfig, GRPOSamplerConfig])
def test_bad_settings_are_refused_at_config_time(config_cls, overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        config_cls(**base_args(tmp_path, **overrides))


def test_vespo_needs_a_token_mode_at_config_time(tmp_path):
    with pytest.raises(ValueError, match="loss_type='vespo' needs vllm_importance_sampling_mode"):
        GRPOSamplerConfig(**base_args(tmp_path, use_in_process_sampler=True, loss_type="vespo"))


def test_trainer_time_refusals(model_path, tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="GRPOSamplerTrainer needs a GRPOSamplerConfig"):
        GRPOSamplerTrainer(model_path, vowel_reward, args=GRPOConfig(**base_args(tmp_path)))

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first.
            b: second.
        """
        return a + b

    with pytest.raises(ValueError, match="does not run tool calls or environments"):
        _trainer_with(model_path, tmp_path, tools=[add])
    with pytest.raises(ValueError, match="a rollout_func replaces the generation"):
        _trainer_with(model_path, tmp_path, rollout_func=lambda prompts, trainer: {})
    with pytest.raises(ValueError, match="not supported with DeepSpeed ZeRO-3"):
        refuse_sharded_training(is_zero3=True, is_fsdp=False)
    with pytest.raises(ValueError, match="not supported with FSDP"):
        refuse_sharded_training(is_zero3=False, is_fsdp=True)
    refuse_sharded_training(is_zero3=False, is_fsdp=False)
    with pytest.raises(ValueError, match="runs on the CPU only .* the trainer is on cuda"):
        refuse_int8_off_cpu(SamplerSettings(quantization="int8"), torch.device("cuda"))
    refuse_int8_off_cpu(SamplerSettings(quantization="int8"), torch.device("cpu"))
    refuse_int8_off_cpu(SamplerSettings(dtype="bfloat16"), torch.device("cuda"))


def _trainer_with(model_path, tmp_path, **kwargs):
    args = GRPOSamplerConfig(**base_args(tmp_path, use_in_process_sampler=True, beta=0.0))
    return GRPOSamplerTrainer(
        model_path,
        vowel_reward,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        **kwargs,
    )


# ---------------------------------------------------------------------------------------- TRL lines followed
# GRPOTrainer method -> (first text, last text, digest) of lines InProcessSampler follows: its generation (the
# plain path's padding, generate and cut after the first EOS) and, for the faithful sampler, the batch TRL
# builds and scores (padding, truncation mask, chunk size, the no-grad forward); the bit-identity test above
# checks them in behaviour, these digests name the lines when a TRL release changes them.
FOLLOWED = {
    "_generate_single_turn": [
        (
            "prompt_tensors = [torch.tensor(ids) for ids in prompt_ids]",
            "logprobs = None  # not used in this case",
            "c821134a1290724b",
        )
    ],
    "_generate_and_score_completions": [
        (
            "completion_ids = [torch.tensor(ids) for ids in completion_ids_list]",
            "logits_to_keep = completion_ids.size(1)",
            "7def7d298074223f",
        ),
        (
            'batch_size = self.args.per_device_train_batch_size if mode == "train"',
            "old_per_token_logps = None",
            "796c4acf6ccf42f8",
        ),
    ],
}


@pytest.mark.parametrize("trl_method", list(FOLLOWED))
def test_the_trl_lines_the_sampler_follows_have_not_changed(trl_method):
    from trl import GRPOTrainer

    from rgpo_trl.trainer.trl_version import source_segment_digest

    source = inspect.getsource(getattr(GRPOTrainer, trl_method))
    for start, end, digest in FOLLOWED[trl_method]:
        assert source_segment_digest(source, start, end) == digest, (
            f"GRPOTrainer.{trl_method}: the lines from {start!r} to {end!r} changed; "
            "rgpo_trl.trainer.sync_sampler.InProcessSampler follows them"
        )
