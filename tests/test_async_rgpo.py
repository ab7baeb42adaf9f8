"""AsyncRGPOTrainer: the RGPO loss in TRL's asynchronous trainer, on a CPU with the in-process worker."""

from __future__ import annotations

import inspect
import json
import math
import queue
import time
import warnings

import numpy as np
import pytest
import torch

warnings.filterwarnings("ignore", message=".*trl.experimental.*")

from _async_utils import config, packed_batch, step_logs, trainer_with_worker  # noqa: E402

from rgpo_trl.async_rgpo import (  # noqa: E402
    AsyncRGPOTrainer,
    InProcessRolloutWorker,
    InProcessWeightTransfer,
    RolloutWorkerError,
    install_cpu_shims,
)
from rgpo_trl.core import AdaptiveKLController  # noqa: E402
from rgpo_trl.testing import tiny_dataset, tiny_tokenizer, vowel_reward  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


# ------------------------------------------------------------------------------------------------ CPU shims
def test_packed_tree_forward_equals_a_plain_forward(model_path):
    """Two samples sharing a prompt, packed into TRL's prefix tree and run through the CPU attention, give
    each token the log-prob a plain forward of that sample gives (temperature-scaled, as TRL's fused head)."""
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout
    from trl.experimental.async_grpo.packing import TREE_ATTENTION, TreeRow, register_tree_attention
    from trl.trainer.utils import add_fused_lm_head, create_model_from_path

    assert install_cpu_shims()
    register_tree_attention()
    packed_model = create_model_from_path(model_path, device_map=None, attn_implementation=TREE_ATTENTION)
    temperature = 0.7
    add_fused_lm_head(packed_model, temperature=temperature, outputs=("log_probs", "entropy"))
    plain = AutoModelForCausalLM.from_pretrained(model_path)
    prompt = [5, 9, 12, 7, 3]
    samples = [prompt + [10, 11, 4, 1], prompt + [20, 6], [8, 8, 9, 14, 15, 16]]
    row = TreeRow()
    for i, ids in enumerate(samples):
        row.add(
            {
                "input_ids": np.array(ids),
                "completion_mask": np.array([0] * 3 + [1] * (len(ids) - 3)),
                "old_log_probs": np.zeros(len(ids), dtype=np.float32),
                "advantage": 1.0,
                "group_id": 0 if i < 2 else 1,
                "metrics": {},
            }
        )
    batch = DataCollatorForRollout(pad_token_id=0, num_processes=1).torch_call([[row]])
    selected = batch["token_index"] >= 0
    tree = {k: batch[k][batch[k] >= 0] for k in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    tree["tree_max_seqlen_q"], tree["tree_max_seqlen_k"] = batch["tree_max_seqlens"][0].tolist()
    with torch.no_grad():
        out = packed_model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            shift_labels=batch["shift_labels"],
            fused_lm_head=True,
            **tree,
        )
    packed = out.log_probs.flatten()[batch["token_index"][selected]]
    expected = []
    for ids in samples:
        with torch.no_grad():
            logits = plain(torch.tensor([ids])).logits[0].double()
        logps = torch.log_softmax(logits[:-1] / temperature, -1).gather(-1, torch.tensor(ids[1:])[:, None])[
            :, 0
        ]
        expected.append(logps[2:])  # the completion tokens (positions 3..), predicted from positions 2..
    assert packed.shape[0] == sum(len(e) for e in expected) == int(selected.sum())
    assert torch.allclose(packed.double(), torch.cat(expected), atol=1e-5)
    assert batch["tree_cu_seqlens_q"].max() < sum(map(len, samples))  # the shared prompt was packed once


# ------------------------------------------------------------------------------------------------ the loss
@pytest.mark.parametrize("mode", ["old", "dual"])
def test_loss_equals_the_closed_form_on_a_packed_batch(model_path, tmp_path, mode):
    """compute_loss on a packed micro-batch equals the RGPO loss written out in float64 from a plain forward:
    sum over trained tokens of -sigmoid(k (r - 1)) A + kl_coef (r - 1 - log r) [+ beta k3(r_ref)], divided by
    the trained tokens and the accumulation steps; in dual mode the gate sees max(r, r_ref)."""
    from transformers import AutoModelForCausalLM

    beta = 0.05 if mode == "dual" else 0.0
    args = config(tmp_path, ratio_mode=mode, beta=beta, gate_params={"k": 4.0}, kl_coef=0.3)
    trainer, _ = trainer_with_worker(model_path, args)
    reference = AutoModelForCausalLM.from_pretrained(model_path).double()
    with torch.no_grad():  # move the policy away from the reference, so that r_ref != 1 and beta * k3 counts
        generator = torch.Generator().manual_seed(1)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by the training loop
    batch, samples = packed_batch(model_path, trainer, noise=0.3, reference=reference)
    loss = trainer.compute_loss(trainer.model, batch)

    total, n = 0.0, 0
    k = 4.0
    for lp, sample, ref_lp in samples:  # log-probs of the trained tokens (positions 3..)
        old = torch.tensor(sample["old_log_probs"][3:], dtype=torch.float64)
        r = torch.exp(lp - old)
        r_ref = torch.exp(lp - ref_lp)
        gated = torch.maximum(r, r_ref) if mode == "dual" else r
        g = 1 / (1 + torch.exp(-k * (gated - 1)))
        per_token = -g * sample["advantage"] + 0.3 * (r - 1 - torch.log(r))
        if mode == "dual":
            per_token = per_token + beta * (1 / r_ref - 1 + torch.log(r_ref))  # k3 KL to the reference
            assert (r_ref - 1).abs().max() > 0.01  # the reference term is not trivially zero
        total += per_token.sum().item()
        n += len(lp)
    expected = total / n / args.gradient_accumulation_steps
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)
    loss.backward()  # the gradient flows through the packed forward
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())


# ------------------------------------------------------------------------------------------------ end to end
def test_controlled_lag_gives_exact_staleness_and_the_gate_acts(model_path, tmp_path):
    """With lag 2 every trained token of step s is min(s - 1, 2) versions behind; at step 1 (staleness 0) the
    worker's behaviour log-probs equal the trainer's packed forward, so r == 1; the KL coefficient follows the
    adaptive rule on the logged per-step KL; the gate's statistics are logged by staleness."""
    trainer, worker = trainer_with_worker(model_path, config(tmp_path, max_steps=5), lag=2)
    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 5
    for s, log in enumerate(logs, start=1):
        assert log["staleness/mean"] == log["staleness/max"] == min(s - 1, 2)
    assert logs[0]["rgpo/ratio_old_max"] == pytest.approx(1.0, abs=1e-4) and logs[0]["rgpo/kl_old"] < 1e-8
    assert logs[-1]["rgpo/ratio_old_max"] > 1.05 and logs[-1]["rgpo/kl_old"] > 1e-4  # stale samples: r moved
    # shares with max(r, 1 / r) beyond 1.2 and 2: none while r == 1, nested after
    assert logs[0]["rgpo/ratio_old_beyond_1.2"] == logs[0]["rgpo/ratio_old_beyond_2"] == 0.0
    assert all(0 <= log["rgpo/ratio_old_beyond_2"] <= log["rgpo/ratio_old_beyond_1.2"] <= 1 for log in logs)
    assert logs[-1]["rgpo/rejected_frac_staleness2plus"] == pytest.approx(logs[-1]["rgpo/rejected_frac"])
    assert logs[-1]["staleness/tokens_2plus"] == 1.0 and math.isnan(logs[-1]["rgpo/weight_mean_staleness0"])
    replay = AdaptiveKLController()
    for log in logs:  # the coefficient logged in a step is the one before that step's update
        assert log["rgpo/kl_coef"] == pytest.approx(replay.kl_coef)
        replay.update(log["rgpo/kl_old_step"])
    assert trainer.kl_ctl.kl_coef == pytest.approx(replay.kl_coef)
    assert trainer.model_version == 6  # the cold sync, then one sync per optimizer step
    assert not worker._thread.is_alive()


def test_free_running_worker_trains_and_reports_staleness(model_path, tmp_path):
    trainer, _ = trainer_with_worker(model_path, config(tmp_path, max_steps=3), lag=None, max_queued_steps=2)
    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 3 and all(0 <= log["staleness/max"] <= 4 for log in logs)


# ------------------------------------------------------------------------------------------------ faults
def test_a_reward_function_that_raises_stops_training_with_the_workers_name(model_path, tmp_path):
    def broken(completions, **kwargs):
        raise ZeroDivisionError("reward model crashed")

    trainer, _ = trainer_with_worker(model_path, config(tmp_path, max_steps=2), reward=broken)
    start = time.monotonic()
    with pytest.raises(RolloutWorkerError, match=r"InProcessRolloutWorker failed: ZeroDivisionError"):
        trainer.train()
    assert time.monotonic() - start < 30


def test_a_hanging_worker_stops_training_instead_of_hanging(model_path, tmp_path):
    def slow(completions, **kwargs):
        time.sleep(8)
        return [0.0] * len(completions)

    trainer, _ = trainer_with_worker(
        model_path, config(tmp_path, max_steps=2, heartbeat_stale_after_s=1.0), reward=slow
    )
    start = time.monotonic()
    with pytest.raises(RolloutWorkerError, match=r"produced nothing for \d+s"):
        trainer.train()
    assert time.monotonic() - start < 30


class _StaleStubWorker:
    """Puts 4 samples of version -10 (too old) before every fresh batch of 16 (two steps' worth: TRL's loader
    reads one micro-batch ahead of the weights it trains)."""

    def __init__(self):
        self.rollout_buffer, self.metrics_queue, self.version, self.dropped = (
            queue.Queue(),
            queue.Queue(),
            0,
            0,
        )

    def _fill(self):
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        for version, n in ((-10, 4), (self.version, 16)):
            for i in range(n):
                ids = np.array([5, 6, 7, 8, 9 + i % 4, 10], dtype=np.int64)
                self.rollout_buffer.put(
                    RolloutSample(
                        prompt=[],
                        completion=[],
                        input_ids=ids,
                        completion_mask=np.array([0, 0, 0, 1, 1, 1]),
                        old_log_probs=np.full(6, -3.0, dtype=np.float32),
                        advantage=float(i % 4) - 1.5,
                        model_version=version,
                        group_id=100 * self.version + i // 4 + (1000 if version < 0 else 0),
                        metrics={},
                    )
                )
            self.dropped += n if version < 0 else 0

    def start(self):
        pass

    def stop(self):
        pass

    def update_model_version(self, v):
        self.version = v
        self._fill()

    def check_health(self, stale_after_s):
        pass


def test_samples_older_than_max_staleness_are_dropped_counted_and_never_trained(model_path, tmp_path):
    stub = _StaleStubWorker()
    args = config(tmp_path, max_steps=3, max_staleness=1)
    trainer = AsyncRGPOTrainer(
        model_path,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        rollout_worker=stub,
        weight_transfer=InProcessWeightTransfer(_Sink()),
    )
    trainer.train()
    logs = step_logs(trainer)
    assert sum(log.get("sample/dropped_stale_total", 0) for log in logs) >= 8
    assert all(
        log["staleness/max"] <= 1 for log in logs
    )  # the version travels with the sample that is trained


class _Sink:
    def receive_weights(self, named):
        pass


# ------------------------------------------------------------------------------------------------ checkpoints
def test_resume_restores_the_controller_and_the_weight_version(model_path, tmp_path):
    args = config(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, kl_target=0.001)
    trainer, _ = trainer_with_worker(model_path, args)
    trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    saved = json.loads((checkpoint / "rgpo_kl_controller.json").read_text())
    assert json.loads((checkpoint / "async_rgpo_state.json").read_text())["model_version"] == 3
    assert saved["num_updates"] == 2
    resumed, _ = trainer_with_worker(
        model_path, config(tmp_path, max_steps=4, save_strategy="no", kl_target=0.001)
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    logs = [log for log in step_logs(resumed) if log["step"] > 2]  # the state's history holds steps 1-2 too
    assert [log["step"] for log in logs] == [3, 4] and logs[0]["rgpo/kl_coef"] == pytest.approx(
        saved["kl_coef"]
    )
    assert resumed.kl_ctl.num_updates == 4 and resumed.model_version == 3 + 1 + 2
    (checkpoint / "rgpo_kl_controller.json").write_text("{not json")
    broken, _ = trainer_with_worker(model_path, config(tmp_path, max_steps=4, save_strategy="no"))
    with pytest.raises(ValueError, match="rgpo_kl_controller.json is not valid JSON"):
        broken.train(resume_from_checkpoint=str(checkpoint))


# ------------------------------------------------------------------------------------------------ config
def test_settings_it_cannot_honour_are_refused_by_name(model_path, tmp_path):
    with pytest.raises(ValueError, match=r"epsilon=0.3 is not supported by AsyncRGPOTrainer"):
        config(tmp_path, epsilon=0.3)
    with pytest.raises(ValueError, match="gate must be one of"):
        config(tmp_path, gate="nope")
    with pytest.raises(ValueError, match=r"gate_params: .*k"):
        config(tmp_path, gate_params={"k": -1.0})
    args = config(tmp_path)
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match=r"lag must be None .* \[1, max_staleness = 4\], got 5"):
        InProcessRolloutWorker(model_path, tok, tiny_dataset(), [vowel_reward], args, lag=5)
    with pytest.raises(ValueError, match=r"lag must be .* got 0"):
        InProcessRolloutWorker(model_path, tok, tiny_dataset(), [vowel_reward], args, lag=0)
    with pytest.raises(ValueError, match="token_budget must be 0"):
        InProcessRolloutWorker(
            model_path, tok, tiny_dataset(), [vowel_reward], config(tmp_path, token_budget=64)
        )
    with pytest.raises(ValueError, match="multiple of num_generations = 3"):
        InProcessRolloutWorker(
            model_path, tok, tiny_dataset(), [vowel_reward], config(tmp_path, num_generations=3)
        )
    with pytest.raises(ValueError, match=r"top_p=0.9 is not supported by InProcessRolloutWorker"):
        InProcessRolloutWorker(model_path, tok, tiny_dataset(), [vowel_reward], config(tmp_path, top_p=0.9))
    with pytest.raises(ValueError, match="weight_sync_steps must be 1 with a controlled lag"):
        InProcessRolloutWorker(
            model_path, tok, tiny_dataset(), [vowel_reward], config(tmp_path, weight_sync_steps=2), lag=1
        )
    with pytest.raises(ValueError, match="token_budget must be 0"):
        InProcessRolloutWorker(
            model_path, tok, tiny_dataset(), [vowel_reward], config(tmp_path, token_budget=None)
        )
    with pytest.raises(TypeError, match="needs an AsyncRGPOConfig"):
        AsyncRGPOTrainer(model_path, args=None)


# ------------------------------------------------------------------------------------------------ TRL guard
# the lines of AsyncGRPOTrainer.compute_loss that AsyncRGPOTrainer._packed_forward mirrors (TRL 1.16)
MIRRORED = {
    ("mask_bool = ", "self._last_forward_time_s = time.time() - forward_start"): "cdca0a3131845613",
    ("n_forward_tokens = float(", "self._step_forward_s += self._last_forward_time_s"): "597640bda32426fd",
}


def test_the_mirrored_trl_code_has_not_changed():
    """Fails when a TRL upgrade changes the code `_packed_forward` copies or the names `get_train_dataloader`
    swaps: re-read TRL's compute_loss / get_train_dataloader, update the copy, then the hashes."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from rgpo_trl.trainer.trl_version import source_segment_digest

    source = inspect.getsource(AsyncGRPOTrainer.compute_loss)
    for (start, end), digest in MIRRORED.items():
        assert source_segment_digest(source, start, end) == digest, (start, end)
    loader = inspect.getsource(AsyncGRPOTrainer.get_train_dataloader)
    assert "RolloutQueueDataset(" in loader and "DataCollatorForRollout(" in loader


def test_group_advantages_are_trls_and_leave_unscored_samples_out():
    from rgpo_trl.async_rgpo.worker import _until_eos, group_advantages

    rewards = np.array([1.0, 2.0, 3.0, np.nan, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(rewards, 4)
    first = np.array([1.0, 2.0, 3.0])
    assert np.allclose(adv[:3], (first - 2.0) / (first.std() + 1e-8)) and adv[3] == 0.0
    assert np.allclose(adv[4:], 0.0)  # a group of equal rewards: no signal
    assert _until_eos([5, 6, 1, 0, 0], [1]) == [5, 6, 1] and _until_eos([5, 0, 6], [1]) == [5, 0, 6]
