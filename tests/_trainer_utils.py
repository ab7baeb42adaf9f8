"""Test-only helpers for the trainer tests: independent log-probs and a recorder of the trainer's loss
calls."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rgpo_trl.testing import (  # noqa: F401
    base_args,
    save_tiny_model,
    tiny_dataset,
    tiny_model,
    tiny_tokenizer,
    vowel_reward,
)


@torch.no_grad()
def independent_logps(model, inputs, temperature: float = 1.0) -> torch.Tensor:
    """log pi(completion token) from a plain forward pass (no TRL helper): logits at position t predict
    t+1."""
    completion_ids = inputs["completion_ids"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    n = completion_ids.size(1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -n - 1 : -1].float()
    logps = (logits / temperature).log_softmax(-1)
    return logps.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def attach_recorder(trainer, extra=None) -> list[dict]:
    """Wrap ``trainer._compute_loss`` to record, per micro-batch, the inputs, the returned loss, the KL-to-old
    coefficient in use, the micro-batch counter and log-probs recomputed independently by a plain forward pass
    (before the optimizer step changes the parameters). ``extra(trainer, model, inputs, record)`` may add
    more."""
    records: list[dict] = []
    original = trainer._compute_loss

    def wrapped(model, inputs):
        record = {
            "step": trainer._step,
            "kl_coef": getattr(trainer, "kl_coef", None),
            "inputs": {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inputs.items()},
            "logps": independent_logps(trainer.accelerator.unwrap_model(model), inputs, trainer.temperature),
        }
        loss = original(model, inputs)
        record["loss"] = loss.detach().clone()
        if extra is not None:
            extra(trainer, model, inputs, record)
        records.append(record)
        return loss

    trainer._compute_loss = wrapped
    return records
