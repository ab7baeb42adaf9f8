"""Held-out evaluation of a trained policy, the same code for every method (online ones and DPO): one sampled
completion per prompt, scored by the proxy reward model, by the gold rule where the world has one, and its KL
to the reference policy.

KL_ref is the mean over the sampled completion tokens of the k3 estimate exp(log pi_ref - log pi) -
(log pi_ref - log pi) - 1, the estimator of the training metric ``kl_ref/monitor``, so held-out and training
numbers are comparable.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from transformers import TrainerCallback

from rgpo_trl.core import clamp_log_ratio, kl_ref_estimate

from .json_io import dump, dumps


@torch.no_grad()
def completion_logps(
    model, input_ids, attention_mask, n_completion: int, temperature: float = 1.0
) -> torch.Tensor:
    """log pi(token) of the last ``n_completion`` tokens (logits at t predict t + 1)."""
    logits = (
        model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -n_completion - 1 : -1].float()
    )
    logps = (logits / temperature).log_softmax(-1)
    return logps.gather(-1, input_ids[:, -n_completion:, None]).squeeze(-1)


@torch.no_grad()
def evaluate_policy(
    model,
    tokenizer,
    prompts: Sequence[Any],
    reward_fn: Callable[..., list[float]],
    *,
    ref_model=None,
    gold_fn: Callable[..., list[float]] | None = None,
    max_new_tokens: int = 64,
    batch_size: int = 16,
    temperature: float = 1.0,
    seed: int = 0,
    per_completion: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Sample one completion per conversational prompt; return the means of the proxy reward, the gold score
    (if ``gold_fn``) and KL_ref. ``ref_model=None`` with a PEFT ``model`` uses the model with its adapter
    disabled as the reference (as TRL does). ``per_completion`` adds every completion's scores, in prompt
    order (``"per_completion": {"reward": [...], "gold": [...]}``), for paired comparisons on the same
    prompts. ``progress`` is called with the number of completions scored after each batch (a long
    evaluation on a CPU is otherwise silent)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    rewards, golds, kl_sums, kl_counts = [], [], 0.0, 0.0
    try:
        for start in range(0, len(prompts), batch_size):
            batch = list(prompts[start : start + batch_size])
            texts = [
                tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in batch
            ]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                pad_token_id=tokenizer.pad_token_id,
            )
            completion_ids = out[:, enc["input_ids"].shape[1] :]
            # completion mask: tokens up to and including the first end-of-sequence token
            is_eos = completion_ids == tokenizer.eos_token_id
            first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion_ids.size(1))
            mask = (torch.arange(completion_ids.size(1), device=device)[None] <= first_eos[:, None]).float()
            attention = torch.cat([enc["attention_mask"], mask.long()], 1)
            n = completion_ids.size(1)
            logps = completion_logps(model, out, attention, n, temperature)
            if ref_model is not None:
                ref_logps = completion_logps(ref_model, out, attention, n, temperature)
            else:
                with model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext():
                    ref_logps = completion_logps(model, out, attention, n, temperature)
            kl = kl_ref_estimate(clamp_log_ratio(logps - ref_logps))
            kl_sums += float((kl * mask).sum())
            kl_counts += float(mask.sum())
            texts = tokenizer.batch_decode(
                completion_ids, skip_special_tokens=True
            )  # after EOS: only padding
            completions = [[{"role": "assistant", "content": t}] for t in texts]
            rewards += list(reward_fn(prompts=batch, completions=completions))
            if gold_fn is not None:
                golds += list(gold_fn(prompts=batch, completions=completions))
            if progress is not None:
                progress(len(rewards))
    finally:
        tokenizer.padding_side = padding_side
        torch.random.set_rng_state(generator_state)
        model.train(was_training)
    result = {
        "prompts": len(prompts),
        "reward": sum(rewards) / len(rewards),
        "reward_std": _sample_std(rewards),
        "kl_ref": kl_sums / max(kl_counts, 1.0),
        "completion_tokens_mean": kl_counts / len(prompts),
    }
    if gold_fn is not None:
        result["gold"] = sum(golds) / len(golds)
        result["gold_std"] = _sample_std(golds)
    if per_completion:
        result["per_completion"] = {"reward": list(rewards), **({"gold": list(golds)} if gold_fn else {})}
    return result


def _sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof 1) over completions: the scale of a score, e.g. to express a shift of
    the proxy reward and of the gold score in the same units."""
    return statistics.stdev(values) if len(values) >= 2 else float("nan")


def paired_standard_error(initial: dict[str, Any], trained: dict[str, Any], key: str) -> float:
    """Standard error of mean(trained) - mean(initial) on the same prompts: the sample std over prompts of the
    per-prompt difference of means (the samples of a prompt share it), / sqrt(prompts); from the two
    evaluations' ``per_completion`` scores (prompt order, ``samples_per_prompt`` each)."""
    k = trained.get("samples_per_prompt", 1)
    a, b = initial["per_completion"][key], trained["per_completion"][key]
    if len(a) != len(b) or len(a) % k:
        raise ValueError(f"per_completion {key}: {len(a)} and {len(b)} scores for {k} samples a prompt")
    diffs = [statistics.fmean(b[i : i + k]) - statistics.fmean(a[i : i + k]) for i in range(0, len(a), k)]
    return _sample_std(diffs) / len(diffs) ** 0.5


def comparison_table(initial: dict[str, Any], trained: dict[str, Any], method: str) -> str:
    """The initial (SFT) policy against the trained one on the same held-out prompts: proxy reward, gold
    (where the world has one) and KL_ref, then one sentence on what happened. A change counts when it exceeds
    twice its paired standard error (`paired_standard_error`; both evaluations need ``per_completion``
    scores)."""
    keys = [
        ("reward", "proxy reward"),
        *([("gold", "gold")] if "gold" in trained else []),
        ("kl_ref", "KL_ref"),
    ]
    width = max(len(method) + 10, 18)
    lines = [
        f"{'held-out prompts: ' + str(trained['prompts']):{width}s}" + "".join(f"{n:>14s}" for _, n in keys)
    ]
    for label, r in (("SFT policy", initial), (f"trained ({method})", trained)):
        lines.append(f"{label:{width}s}" + "".join(f"{r[k]:14.3f}" for k, _ in keys))
    d_reward, reward_se = (
        trained["reward"] - initial["reward"],
        paired_standard_error(initial, trained, "reward"),
    )
    rose = d_reward > 2 * reward_se
    if "gold" not in trained:
        verdict = f"The proxy reward {'rose' if rose else 'did not change beyond noise'} ({d_reward:+.3f})."
    else:
        d_gold, gold_se = trained["gold"] - initial["gold"], paired_standard_error(initial, trained, "gold")
        change = (
            f"gold {d_gold:+.3f} (s.e. {gold_se:.3f}), proxy reward {d_reward:+.3f} (s.e. {reward_se:.3f})"
        )
        if d_gold > 2 * gold_se:
            verdict = (
                f"Training improved the policy: {change}, at KL_ref {trained['kl_ref']:.3f} "
                "from the SFT policy."
            )
        elif d_gold < -2 * gold_se and rose:
            verdict = (
                f"Over-optimised: {change}: the proxy reward rose while gold fell, the policy exploits the "
                "imperfect reward model; a lower learning rate or a larger beta keeps it closer to the SFT "
                "policy."
            )
        elif d_gold < -2 * gold_se:
            verdict = f"Training made the policy worse: {change}."
        else:
            verdict = f"No clear change: {change}; train longer or with a larger learning rate."
    return "\n".join([*lines, verdict])


def repeat_prompts(prompts: Sequence[Any], samples_per_prompt: int) -> list[Any]:
    """Each prompt ``samples_per_prompt`` times in a row, so `evaluate_policy` averages that many independent
    samples per prompt (a held-out estimate that is not one noisy sample per prompt)."""
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    return [p for p in prompts for _ in range(samples_per_prompt)]


class WindowEvaluation(TrainerCallback):
    """Trainer callback: the shared evaluation of the policy on a fixed prompt set (e.g. validation prompts
    held out of the training split) at chosen generation-batch iterations, one JSON row per evaluation in
    ``path`` and, at the end, the mean over the rows in ``summary_path``: the model-selection criterion of a
    tuning suite, never computed on the test prompts.

    Resumable: rows written after the checkpoint a run resumes from are dropped and evaluated again. Each
    evaluation seeds its own sampling (``seed`` + iteration) and restores torch's RNG state, so training is
    the same with and without it. Single-process runs only (like the held-out evaluation).
    """

    def __init__(
        self,
        path: str,
        summary_path: str,
        prompts: Sequence[Any],
        iterations: Sequence[int],
        steps_per_iteration: int,
        evaluate: Callable[[Any, Sequence[Any], int], dict[str, float]],
        seed: int = 0,
    ):
        if not iterations:
            raise ValueError("WindowEvaluation needs at least one iteration to evaluate at")
        self.path, self.summary_path = path, summary_path
        self.prompts, self.iterations = list(prompts), sorted(set(iterations))
        self.steps_per_iteration, self.evaluate, self.seed = steps_per_iteration, evaluate, seed

    def _rows(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def on_train_begin(self, args, state, control, **kwargs):
        done = state.global_step // self.steps_per_iteration
        kept = [r for r in self._rows() if r["iteration"] <= done]
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w") as f:
            f.writelines(dumps(r) + "\n" for r in kept)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.steps_per_iteration:
            return
        iteration = state.global_step // self.steps_per_iteration
        if iteration not in self.iterations or not state.is_world_process_zero:
            return
        row = {"iteration": iteration, **self.evaluate(model, self.prompts, self.seed + iteration)}
        with open(self.path, "a") as f:
            f.write(dumps(row) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        rows = self._rows()
        keys = [k for k in ("reward", "gold", "kl_ref") if rows and all(k in r for r in rows)]
        summary = {
            "iterations": [r["iteration"] for r in rows],
            "expected_iterations": self.iterations,
            "prompts": len(self.prompts),
            **{k: _finite_mean([r[k] for r in rows]) for k in keys},
        }
        with open(self.summary_path, "w") as f:
            dump(summary, f, indent=2)


def _finite_mean(values: Sequence[float | None]) -> float:
    """The mean of the finite values (a row's NaN is written, and read back, as null); NaN when none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")
