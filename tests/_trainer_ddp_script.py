"""Worker for the two-process RGPOTrainer test (tests/test_rgpo_trainer_distributed.py); run under
``torchrun --nproc_per_node 2``. Trains a few steps on CPU (gloo) and writes what each rank saw to
``<out>/rank<R>.json``. Usage: python _trainer_ddp_script.py MODEL_DIR OUT_DIR"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _trainer_utils import base_args, tiny_dataset, tiny_tokenizer, vowel_reward  # noqa: E402

from rgpo_trl import RGPOConfig, RGPOTrainer  # noqa: E402


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    args = RGPOConfig(
        **base_args(
            os.path.join(out_dir, "run"),
            per_device_train_batch_size=4,
            num_generations=4,
            learning_rate=0.3,
            lr_scheduler_type="constant",
            max_steps=4,
        )
    )
    trainer = RGPOTrainer(
        model_dir, vowel_reward, args=args, train_dataset=tiny_dataset(32), processing_class=tiny_tokenizer()
    )
    local_kl, coefs = [], []
    original_log = trainer._log_rgpo_metrics
    original_end = trainer._end_iteration

    def log_metrics(mode, diag, entropies, mask):
        local_kl.append(diag["kl_old"].item())  # this rank's own token mean, before the reduction
        original_log(mode, diag, entropies, mask)

    def end_iteration():
        original_end()
        coefs.append(trainer.kl_coef)

    trainer._log_rgpo_metrics = log_metrics
    trainer._end_iteration = end_iteration
    trainer.train()
    rank = trainer.accelerator.process_index
    result = {
        "rank": rank,
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "num_processes": trainer.accelerator.num_processes,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "kl_coef_after_each_iteration": coefs,
        "local_kl_old": local_kl,
        "kl_old_iteration": [
            e["rgpo/kl_old_iteration"] for e in trainer.state.log_history if "rgpo/kl_old_iteration" in e
        ],
        "metric_keys": sorted(set().union(*(e.keys() for e in trainer.state.log_history))),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
