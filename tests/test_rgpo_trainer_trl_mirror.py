"""RGPOTrainer mirrors or adapts a few pieces of TRL 1.16's GRPOTrainer that TRL offers no hook or method for
(its ``_compute_loss`` is one method: forward, surrogate, aggregation, entropy bonus, aux loss, metrics). Each
piece lives in one RGPOTrainer method, a helper of its ``_compute_loss``; these tests pin a digest of the TRL
lines it follows, so a TRL release that changes them fails here, naming the lines and the method to re-read,
instead of silently diverging. The entropy controller follows GRPOTrainer's rule on RGPO's own state, so
GRPOTrainer's initialisation and checkpoint of its own state are pinned too."""

from __future__ import annotations

import inspect

import pytest
from trl import GRPOTrainer

from rgpo_trl import RGPOTrainer
from rgpo_trl.trainer.trl_version import source_segment_digest

# GRPOTrainer method -> [(first text, last text) of the lines, the RGPOTrainer method that follows them,
# digest]
MIRRORED = {
    "_compute_loss": [
        # the forward and the loss mask: copied
        (
            'prompt_ids, prompt_mask = inputs["prompt_ids"]',
            "if self.top_entropy_quantile < 1.0:",
            "_policy_forward",
            "0bf39de2b4132095",
        ),
        # the options applied to the surrogate, adapted to the gated term (old log-probs default, masks,
        # sequence-level ratio, k3 KL and its bias correction, vLLM IS correction, beta)
        ("if self.top_entropy_quantile < 1.0:", "entropy_mask = None", "_compute_loss", "fff496ea826bff22"),
        (
            'old_per_token_logps = inputs.get("old_per_token_logps")',
            "off_policy_threshold=self.off_policy_mask_threshold,",
            "_compute_loss",
            "46bf11b63839d303",
        ),
        (
            "log_ratio = per_token_logps - old_per_token_logps",
            "per_token_kl = per_token_kl * coef_1",
            "_compute_loss",
            "4008fe8b5b66e8c8",
        ),
        (
            "if self.off_policy_mask_threshold is not None:\n            per_token_loss",
            "per_token_loss = per_token_loss + self.beta * per_token_kl",
            "_compute_loss",
            "d64ae885cd9f7aee",
        ),
        # the loss_type aggregations and policy_loss: copied, without the gate-replacing loss types
        (
            'if self.loss_type in ["grpo", "sapo"]:',
            'raise ValueError(f"Unknown loss type: {self.loss_type}")',
            "_aggregate",
            "cad6641999ae367e",
        ),
        # the entropy bonus and its adaptive controller: copied
        (
            "if self._entropy_bonus_enabled:",
            'self._metrics[mode]["entropy_coef"].append(self.entropy_coef)',
            "_apply_entropy_bonus",
            "5f44419864f069e7",
        ),
        (
            "if self.aux_loss_enabled:",
            'self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())',
            "_add_aux_loss",
            "c36da4decf96d5fb",
        ),
        # the `kl` and `entropy` metrics: token-weighted global means
        (
            "def global_masked_mean(x):",
            'self._metrics[mode]["entropy"].append(global_masked_mean(entropies))',
            "_global_masked_mean",
            "bddac3906942f2b4",
        ),
    ],
    # GRPOTrainer's entropy controller state, which RGPOTrainer keeps as its own (EntropyControllerState in
    # `entropy_ctl`): initialised as GRPOTrainer initialises entropy_coef, _last_world_entropy and
    # _entropy_window_stats, and checkpointed when GRPOTrainer checkpoints them, with the same contents
    "__init__": [
        (
            "self.entropy_coef = args.entropy_coef",
            "self._entropy_window_stats = None",
            "__init__",
            "a16a6b73e29ecfb7",
        )
    ],
    "_save_checkpoint": [
        (
            "if self.use_adaptive_entropy and self.args.should_save:",
            "self._last_world_entropy}, f)",
            "_save_checkpoint",
            "dee4d4571b8df90b",
        )
    ],
    "_load_optimizer_and_scheduler": [
        (
            "if self.use_adaptive_entropy and checkpoint is not None:",
            'self._last_world_entropy = state["last_world_entropy"]',
            "_load_optimizer_and_scheduler",
            "14849693a6aa059f",
        )
    ],
}


@pytest.mark.parametrize("trl_method", list(MIRRORED))
def test_the_trl_lines_rgpo_trainer_mirrors_have_not_changed(trl_method):
    """Fails when TRL changes lines that an RGPOTrainer method copies or adapts: re-read TRL's lines, update
    the named method, then the digest."""
    source = inspect.getsource(getattr(GRPOTrainer, trl_method))
    for start, end, ours, digest in MIRRORED[trl_method]:
        assert ours in vars(RGPOTrainer), f"RGPOTrainer.{ours} (named in MIRRORED) no longer exists"
        assert source_segment_digest(source, start, end) == digest, (
            f"GRPOTrainer.{trl_method}: the lines from {start!r} to {end!r} changed; RGPOTrainer.{ours} "
            "follows them"
        )


def test_the_digest_sees_code_not_comments_or_indentation():
    source = "def f(x):\n    y = x + 1  # one\n    return y\n"
    digest = source_segment_digest(source, "y = ", "return y")
    assert source_segment_digest(source.replace("# one", "# two"), "y = ", "return y") == digest
    assert source_segment_digest(source.replace("    ", "        "), "y = ", "return y") == digest
    assert source_segment_digest(source.replace("x + 1", "x + 2"), "y = ", "return y") != digest
    # a '#' inside a string literal is code: what follows it still counts
    quoted = 'def f(x):\n    y = x + "#1"  # one\n    return y\n'
    digest = source_segment_digest(quoted, "y = ", "return y")
    assert source_segment_digest(quoted.replace('"#1"', '"#2"'), "y = ", "return y") != digest
    assert source_segment_digest(quoted.replace("# one", "# two"), "y = ", "return y") == digest
