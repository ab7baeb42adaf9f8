"""`PPORLHFTrainer`: PPO-RLHF with a value model (Ouyang et al. 2022), the paper's main RLHF baseline, on
TRL's `GRPOTrainer` (TRL 1.x no longer ships a PPOTrainer).

GRPOTrainer already generates, scores with the reward functions, computes the behaviour policy's and the
reference model's per-token log-probs, reuses each generation batch ``num_iterations`` times and handles
DDP / DeepSpeed / PEFT. This subclass replaces what PPO-RLHF does differently:

- the advantages: per-token rewards ``-beta * (log pi_old - log pi_ref)`` plus the reward-model score on the
  last token, GAE over the completion tokens (gamma 1, lambda 0.95) with a learned value model, whitened over
  the batch's valid tokens (`rgpo_trl.core.ppo_rlhf`);
- the loss: PPO's clipped surrogate plus ``vf_coef`` times the clipped value loss, summed over the completion
  tokens of the accumulated batch and divided by their number (TRL's ``dapo`` normalisation).

The value model is a copy of the policy backbone with a zero-initialised scalar head
(``AutoModelForTokenClassification(num_labels=1)`` from the policy's checkpoint), not the reward model: in the
paper's setting the reward model (DeBERTa) has another tokenizer than the policy (Qwen), and a value model
must read the policy's tokens. It is attached to the policy as the submodule ``value_model``, so that the
Trainer's optimizer, gradient accumulation, DDP, DeepSpeed and checkpoints (and ``resume_from_checkpoint``)
treat it with the policy; saved models therefore carry ``value_model.*`` weights next to the policy's
(``from_pretrained`` of the causal LM skips them), and `PPORLHFTrainer.save_value_model` writes the value
model on its own.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForTokenClassification
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ..core import masked_mean
from ..core.ppo_rlhf import clipped_surrogate, clipped_value_loss, gae, masked_whiten, shaped_rewards
from .config import refuse_changed_grpo_fields

# GRPOConfig fields PPO-RLHF does not read (its advantages come from GAE, its loss is PPO's): refused when
# set.
_WHY = "its advantages come from GAE with a value model and its loss is PPO's clipped surrogate"
_PPO_REFUSED = {
    name: _WHY
    for name in (
        "loss_type",
        "scale_rewards",
        "multi_objective_aggregation",
        "importance_sampling_level",
        "delta",
        "entropy_coef",
        "use_adaptive_entropy",
        "top_entropy_quantile",
        "off_policy_mask_threshold",
    )
}

# what _compute_loss logs, in the order of its sums
_LOGGED = ("ppo/policy_loss", "ppo/value_loss", "ppo/clipfrac", "ppo/vf_clipfrac", "ppo/approx_kl", "entropy")


@dataclass
class PPORLHFConfig(GRPOConfig):
    r"""Configuration of `PPORLHFTrainer`: `trl.GRPOConfig` plus the value model and GAE settings.

    ``beta`` is the coefficient of the KL penalty folded into the per-token reward (paper: beta_ref = 0.05),
    not a loss term; ``epsilon`` is PPO's clip range; ``num_iterations`` (default 2) the PPO epochs over each
    batch. GRPO settings that only GRPO's advantages or loss read are refused.
    """

    vf_coef: float = field(default=0.1, metadata={"help": "Coefficient of the clipped value loss (> 0)."})
    cliprange_value: float = field(
        default=0.2, metadata={"help": "Clip range of the value update around the old values (> 0)."}
    )
    gae_gamma: float = field(default=1.0, metadata={"help": "Discount over completion tokens, in (0, 1]."})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda, in [0, 1]."})
    whiten_advantages: bool = field(
        default=True, metadata={"help": "Whiten the advantages over the generation batch's valid tokens."}
    )
    beta: float = field(
        default=0.05,
        metadata={
            "help": "KL coefficient in the per-token reward -beta (log pi_old - log pi_ref); "
            "> 0 (paper: 0.05)."
        },
    )
    num_iterations: int = field(default=2, metadata={"help": "PPO epochs over each generation batch."})
    use_bias_correction_kl: bool = field(
        default=False, metadata={"help": "Must be False: the KL is in the reward, not a loss term."}
    )

    def __post_init__(self):
        def positive(name, value, upper=None, closed_upper=True):
            ok = isinstance(value, (int, float)) and value > 0 and (upper is None or value <= upper)
            if not ok:
                bound = f"(0, {upper}]" if upper is not None else "(0, inf)"
                raise ValueError(f"{name} must be a number in {bound}, got {value!r}")

        positive("vf_coef", self.vf_coef)
        positive("cliprange_value", self.cliprange_value)
        positive("gae_gamma", self.gae_gamma, 1.0)
        positive("beta", self.beta)
        if not (isinstance(self.gae_lambda, (int, float)) and 0.0 <= self.gae_lambda <= 1.0):
            raise ValueError(f"gae_lambda must be a number in [0, 1], got {self.gae_lambda!r}")
        if self.use_bias_correction_kl:
            raise ValueError(
                "use_bias_correction_kl must be False for PPO-RLHF: the KL is part of the reward"
            )
        refuse_changed_grpo_fields(self, _PPO_REFUSED, "PPORLHFTrainer")
        super().__post_init__()


class PPORLHFTrainer(GRPOTrainer):
    """PPO-RLHF with a value model on GRPOTrainer's generation and scoring (see the module docstring).

    Same constructor as `trl.GRPOTrainer` plus ``value_model`` (default: a copy of the policy backbone with a
    scalar head). Metrics: ``ppo/score`` (reward-model score), ``ppo/kl_shaped`` (mean per-token KL in the
    reward), ``ppo/value_mean``, ``ppo/returns_mean``, ``ppo/policy_loss``, ``ppo/value_loss``,
    ``ppo/clipfrac``, ``ppo/vf_clipfrac``, ``ppo/approx_kl`` (to pi_old), next to TRL's.
    """

    _tag_names = ["trl", "ppo", "rgpo-trl"]
    _name = "PPO-RLHF"
    _paper = {
        "title": "Training language models to follow instructions with human feedback",
        "id": "2203.02155",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @inproceedings{ouyang2022training,
                title        = {{Training language models to follow instructions with human feedback}},
                author       = {Long Ouyang and others},
                year         = 2022,
                booktitle    = {Advances in Neural Information Processing Systems},
            }"""),
    }

    def __init__(
        self, model, reward_funcs=None, args: PPORLHFConfig | None = None, value_model=None, **kwargs
    ):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = PPORLHFConfig(f"{model_name.split('/')[-1]}-PPO")
        elif not isinstance(args, PPORLHFConfig):
            raise TypeError(f"PPORLHFTrainer needs a PPORLHFConfig, got {type(args).__name__}")
        super().__init__(model, reward_funcs, args=args, **kwargs)
        if value_model is None:
            source = model if isinstance(model, str) else get_config_model_id(model.config)
            value_model = AutoModelForTokenClassification.from_pretrained(
                source, num_labels=1, **(args.model_init_kwargs or {})
            )
            head = [
                m for m in value_model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1
            ][-1]
            torch.nn.init.zeros_(head.weight)  # V = 0 at the start: the first advantages are the reward-to-go
            if head.bias is not None:
                torch.nn.init.zeros_(head.bias)
        for (
            m
        ) in value_model.modules():  # no dropout in the value model (e.g. the classifier's 0.1): values and
            if isinstance(m, torch.nn.Dropout):  # returns must not be noisier than the policy's scoring
                m.p = 0.0
        # attached to the policy: one optimizer, DDP / DeepSpeed and checkpoints handle both (module
        # docstring)
        self.model.add_module("value_model", value_model.to(self.accelerator.device))
        self._last_scores: torch.Tensor | None = None

    def save_value_model(self, output_dir: str) -> None:
        """Write the value model alone (``save_pretrained``) to ``output_dir``."""
        self.accelerator.unwrap_model(self.model).value_model.save_pretrained(output_dir)

    # --------------------------------------------------------------------------------------------- advantages
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_scores = rewards_per_func  # gathered over processes; sliced to this process below
        return rewards_per_func

    def _values(self, model, input_ids, attention_mask, logits_to_keep) -> torch.Tensor:
        """V(s_t) for each completion token t: the value head at the position before the token."""
        value_model = self.accelerator.unwrap_model(model).value_model
        out = value_model(input_ids=input_ids, attention_mask=attention_mask).logits[..., 0]
        return out[:, -logits_to_keep - 1 : -1].float()

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        completion_ids = output["completion_ids"]
        mask = output["completion_mask"] * output.get("tool_mask", 1)
        mask = mask.float()
        n, T = completion_ids.shape
        weighted = (self._last_scores * self.reward_weights.to(self._last_scores.device)[None]).nansum(1)
        scores = weighted[self.accelerator.process_index * n : (self.accelerator.process_index + 1) * n]
        input_ids = torch.cat([output["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad():
            old = output.get("old_per_token_logps")
            if (
                old is None
            ):  # on-policy (no reuse): GRPOTrainer did not score pi_old; PPO's ratio and KL need it
                old, _, _ = self._get_per_token_logps_and_entropies(self.model, input_ids, attention_mask, T)
                output["old_per_token_logps"] = old
            values = self._values(self.model, input_ids, attention_mask, T)
            rewards, kl = shaped_rewards(scores, old, output["ref_per_token_logps"], mask, self.beta)
            advantages, returns = gae(rewards, values, mask, self.args.gae_gamma, self.args.gae_lambda)
            if self.args.whiten_advantages:
                advantages = masked_whiten(advantages, mask)
        output.update(advantages=advantages, returns=returns, old_values=values * mask)
        m = self._metrics[mode]
        m["ppo/score"].append(self.accelerator.gather(scores).mean().item())
        m["ppo/kl_shaped"].append(masked_mean(kl, mask).item())
        m["ppo/value_mean"].append(masked_mean(values, mask).item())
        m["ppo/returns_mean"].append(masked_mean(returns, mask).item())
        return output

    # --------------------------------------------------------------------------------------------- loss
    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        T = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, T, compute_entropy=True
        )
        mask = mask.to(logps.dtype)
        pg, clipped = clipped_surrogate(
            logps, inputs["old_per_token_logps"], inputs["advantages"], self.epsilon_low
        )
        values = self._values(model, input_ids, attention_mask, T)
        vf, vf_clipped = clipped_value_loss(
            values, inputs["old_values"], inputs["returns"], self.args.cliprange_value
        )
        mode = "train" if self.model.training else "eval"
        # TRL's "dapo" normaliser: the completion tokens of the whole accumulated batch on all processes
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normalizer = (
                normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            )
        loss = ((pg + self.args.vf_coef * vf) * mask).sum() / normalizer

        with torch.no_grad():
            log_r = logps.detach() - inputs["old_per_token_logps"]
            terms = (pg.detach(), vf.detach(), clipped, vf_clipped, torch.expm1(log_r) - log_r, entropies)
            stats = torch.stack([(x * mask).sum() for x in terms] + [mask.sum()])
            totals = self.accelerator.reduce(stats, reduction="sum")
            means = (totals[:-1] / totals[-1].clamp(min=1.0)).tolist()
        for key, value in zip(_LOGGED, means, strict=True):
            self._metrics[mode][key].append(value)
        return loss
