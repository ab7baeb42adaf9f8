"""A rollout worker and a weight transfer that live in the trainer's process: TRL's asynchronous trainer on a
CPU.

TRL's `AsyncRolloutWorker` talks to a vLLM server in a child process. `InProcessRolloutWorker` implements the
same `RolloutWorkerProtocol` with a thread that generates with its own copy of the policy through
transformers: it takes the behaviour log-probs from that copy, scores the completions with the recipe's reward
functions, computes group advantages as TRL's worker does, and tags each sample with the weight version it was
generated with. `InProcessWeightTransfer` hands it a copy of the trainer's weights at every sync.

Two ways to be stale:
- ``lag=None`` (free running): the thread generates with the newest weights it has, as far ahead as
  ``max_queued_steps`` optimizer steps of samples; the staleness the trainer sees depends on the machine's
  speed.
- ``lag=L`` (controlled): the samples for the optimizer step that trains weight version v are generated with
  version max(first, v - L) exactly, whatever the speed, so staleness is a setting of the experiment. TRL's
  data loader fetches one micro-batch ahead, before the weights it would train are published, so ``lag``
  starts at 1.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..sampler import LogitNoise, SamplerSettings, sampled_log_probs, sampler_model

WORKER_NAME = "InProcessRolloutWorker"


class RolloutWorkerError(RuntimeError):
    """The in-process rollout worker failed or stopped producing samples."""


class InProcessRolloutWorker:
    """`RolloutWorkerProtocol` in a thread of the trainer's process.

    Args:
        model: the policy's path (a fresh copy is loaded for generation) or a model to copy.
        processing_class: the tokenizer (left padding is set on a copy).
        prompts: a dataset with a ``prompt`` column (text or chat messages), cycled in a seeded order per
            epoch.
        reward_funcs: callables ``f(prompts=, completions=, **columns) -> list[float]`` as in TRL.
        args: the trainer's config: ``num_generations``, ``max_completion_length``, ``temperature``,
            ``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``max_staleness``, ``seed``.
        reward_weights: one weight per reward function (default all 1); a weight of 0 logs a score without
            training on it (the tiny world's gold).
        lag: ``None`` (free running) or the controlled lag L >= 1, at most ``args.max_staleness``.
        max_queued_steps: free running: optimizer steps of samples the thread may generate ahead.
    """

    def __init__(
        self,
        model: str | torch.nn.Module,
        processing_class: Any,
        prompts: Any,
        reward_funcs: Sequence[Callable[..., list[float]]],
        args: Any,
        *,
        reward_weights: Sequence[float] | None = None,
        lag: int | None = None,
        max_queued_steps: int = 2,
    ):
        from transformers import AutoModelForCausalLM

        self.num_generations = args.num_generations
        # one optimizer step's samples: TRL's fixed-count batcher takes batch x processes per micro-batch
        self.samples_per_step = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        )
        if self.samples_per_step % self.num_generations:
            raise ValueError(
                "per_device_train_batch_size x gradient_accumulation_steps x processes = "
                f"{self.samples_per_step} "
                "must "
                f"be a multiple of num_generations = {self.num_generations}: the worker produces whole "
                "groups per step"
            )
        if args.token_budget != 0:
            raise ValueError(
                f"token_budget must be 0 with {WORKER_NAME} (got {args.token_budget}): TRL's token-budget "
                "batcher waits for a sample that does not fit before it sends a micro-batch, which a worker "
                "that generates step by step may never send"
            )
        if lag is not None and not (isinstance(lag, int) and 1 <= lag <= args.max_staleness):
            raise ValueError(
                "lag must be None (free running) or an integer in [1, max_staleness = "
                f"{args.max_staleness}], got {lag!r}: samples older than max_staleness are dropped, and "
                "TRL's loader reads one micro-batch ahead of the weights it trains"
            )
        if lag is not None and args.weight_sync_steps != 1:
            raise ValueError(
                f"weight_sync_steps must be 1 with a controlled lag (got {args.weight_sync_steps}): the lag "
                "counts "
                "one published weight version per optimizer step"
            )
        self.sampler = SamplerSettings.from_args(args)  # sampler_dtype & co: a sampler unlike the trainer
        sampling = {"top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}
        for name, neutral in sampling.items():
            value = getattr(args, name, neutral)
            if value != neutral and not (name == "top_k" and value in (None, -1)):
                raise ValueError(
                    f"{name}={value!r} is not supported by {WORKER_NAME}: it samples from softmax(logits / "
                    "temperature), the distribution its behaviour log-probs describe; leave "
                    f"{name} at {neutral!r} (sampler_top_p truncates in the sampler only, as a mismatch)"
                )
        if max_queued_steps < 1:
            raise ValueError(f"max_queued_steps must be >= 1, got {max_queued_steps}")
        if "prompt" not in getattr(prompts, "column_names", []):
            raise ValueError(f"{WORKER_NAME}: prompts needs a 'prompt' column")
        self.reward_funcs = list(reward_funcs)
        self.reward_weights = (
            [1.0] * len(self.reward_funcs) if reward_weights is None else list(reward_weights)
        )
        if len(self.reward_weights) != len(self.reward_funcs) or not self.reward_funcs:
            raise ValueError(
                f"{WORKER_NAME}: reward_weights has {len(self.reward_weights)} entries for "
                f"{len(self.reward_funcs)} reward functions (at least one is needed)"
            )
        self.reward_names = [getattr(f, "__name__", type(f).__name__) for f in self.reward_funcs]
        self.prompts, self.args, self.lag, self.max_queued_steps = prompts, args, lag, max_queued_steps
        self.tokenizer = _left_padding(processing_class)
        if isinstance(model, str):
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        else:
            import copy

            self.model = copy.deepcopy(model)
        self.model.eval().requires_grad_(False)
        self.sampling_model = sampler_model(self.model, self.sampler)
        self._noise = (
            LogitNoise(self.sampler.logit_noise, args.seed + 1) if self.sampler.logit_noise else None
        )
        eos = self.model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self.eos_token_ids = sorted({*eos, self.tokenizer.eos_token_id} - {None})
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self._weights: dict[int, dict[str, torch.Tensor]] = {}  # version -> parameters (a ring in lag mode)
        self._pending: dict[str, torch.Tensor] | None = None
        self._first_version: int | None = None
        self._latest_version = 0
        self._loaded_version: int | None = None
        self._waiting_for: int | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.monotonic()
        self._order = np.random.default_rng(args.seed)
        self._prompt_iter = self._prompt_indices()
        self._group_id = 0

    # ---------------------------------------------------------------- RolloutWorkerProtocol
    def start(self) -> None:
        if self._thread is not None:
            return
        self._heartbeat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=WORKER_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)  # a hung generation is left to die with the process (daemon)

    def update_model_version(self, model_version: int) -> None:
        """The trainer published weight version ``model_version``: label the weights received since the last
        call."""
        with self._cond:
            if self._pending is not None:
                self._weights[model_version] = self._pending
                self._pending = None
                if self._first_version is None:
                    self._first_version = model_version
            self._latest_version = model_version
            self._cond.notify_all()

    def check_health(self, stale_after_s: float) -> None:
        """Raise `RolloutWorkerError` naming the worker if its thread failed, ended or stopped producing;
        called by the trainer whenever it has waited for samples (TRL: every 5 s of an empty queue)."""
        if self._error is not None:
            raise RolloutWorkerError(f"{WORKER_NAME} failed: {self._error!r}") from self._error
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RolloutWorkerError(
                f"{WORKER_NAME}: its thread ended without an error and produces no samples"
            )
        waiting = self._waiting_for
        if waiting is not None and waiting > self._latest_version and self.rollout_buffer.empty():
            raise RolloutWorkerError(
                f"{WORKER_NAME} waits for weight version {waiting} but the trainer, at version "
                f"{self._latest_version}, waits for samples: lag={self.lag} cannot be served"
            )
        silent = time.monotonic() - self._heartbeat
        if silent > stale_after_s:
            raise RolloutWorkerError(
                f"{WORKER_NAME} produced nothing for {silent:.0f}s "
                f"(heartbeat_stale_after_s={stale_after_s:g}): a generation or a reward function hangs"
            )

    # ---------------------------------------------------------------- weights
    def receive_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        """Keep a copy of the trainer's weights; `update_model_version` labels them with their version."""
        known = dict(self.model.named_parameters())
        unknown = sorted(set(named_tensors) - set(known))
        if unknown:
            raise RolloutWorkerError(f"{WORKER_NAME}: received weights it does not have: {unknown[:5]}")
        with self._cond:
            self._pending = named_tensors

    def _weights_for_next_step(self, slot: int) -> int | None:
        """Wait for, load and return the weight version that generates step ``slot`` (None when stopping)."""
        with self._cond:
            while not self._stop.is_set():
                if self._first_version is not None:
                    if self.lag is not None:
                        need = self._first_version + max(0, slot - self.lag)
                        if need <= self._latest_version:
                            break
                        self._waiting_for = need
                    elif self.rollout_buffer.qsize() < self.max_queued_steps * self.samples_per_step:
                        need = self._latest_version
                        break
                self._heartbeat = time.monotonic()  # waiting on the trainer is not a hang
                self._cond.wait(timeout=0.5)
            else:
                return None
            self._waiting_for = None
            state = self._weights[need]
            for version in [v for v in self._weights if v < need]:  # never needed again
                del self._weights[version]
        if self._loaded_version != need:
            with torch.no_grad():
                params = dict(self.model.named_parameters())
                for name, tensor in state.items():
                    params[name].copy_(tensor)
            self.sampling_model = sampler_model(self.model, self.sampler)  # the bf16 / int8 copy of them
            self._loaded_version = need
        return need

    # ---------------------------------------------------------------- generation
    def _prompt_indices(self):
        n = len(self.prompts)
        while True:
            yield from self._order.permutation(n).tolist()

    def _run(self) -> None:
        try:
            for slot in itertools.count():
                version = self._weights_for_next_step(slot)
                if version is None:
                    return
                samples, metrics = self._generate_step(version)
                for sample in samples:
                    self.rollout_buffer.put(sample)
                self.metrics_queue.put(metrics)
                self._heartbeat = time.monotonic()
                with self._cond:
                    self._cond.notify_all()
        except BaseException as err:  # surfaced to the trainer by check_health
            self._error = err

    def _encode_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        encoded = self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])

    @torch.no_grad()
    def _generate_step(self, version: int) -> tuple[list[Any], dict[str, float]]:
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        groups = self.samples_per_step // self.num_generations
        rows = [self.prompts[next(self._prompt_iter)] for _ in range(groups)]
        prompt_ids = [self._encode_prompt(row["prompt"]) for row in rows]
        tok, g = self.tokenizer, self.num_generations
        batch = tok.pad({"input_ids": prompt_ids}, return_tensors="pt")
        self._heartbeat = time.monotonic()
        # a fresh generation config: softmax(logits / T) exactly, whatever the model's own config adds
        config = GenerationConfig(
            do_sample=True,
            temperature=self.args.temperature,
            top_k=0,
            top_p=self.sampler.top_p,
            max_new_tokens=self.args.max_completion_length,
            num_return_sequences=g,
            pad_token_id=tok.pad_token_id,
            eos_token_id=self.eos_token_ids,
        )
        width = batch["input_ids"].shape[1]
        if self.sampler.active:  # the sampler's own log-probs of what it sampled, as vLLM reports them
            processors = LogitsProcessorList([self._noise] if self._noise is not None else [])
            out = self.sampling_model.generate(
                **batch,
                generation_config=config,
                logits_processor=processors,
                return_dict_in_generate=True,
                output_scores=True,
            )
            sequences = out.sequences
            sampled = sampled_log_probs(out.scores, sequences[:, width:])
        else:
            sequences = self.model.generate(**batch, generation_config=config)
        self._heartbeat = time.monotonic()
        completions = [_until_eos(seq[width:].tolist(), self.eos_token_ids) for seq in sequences]
        full = [prompt_ids[i // g] + c for i, c in enumerate(completions)]
        if self.sampler.active:
            logps = [
                np.concatenate([np.zeros(len(prompt_ids[i // g])), sampled[i, : len(c)].numpy()]).astype(
                    np.float32
                )
                for i, c in enumerate(completions)
            ]
        else:
            logps = self._behaviour_logprobs(full)
        texts = tok.batch_decode([c for c in completions], skip_special_tokens=True)
        prompts = [rows[i // g]["prompt"] for i in range(len(full))]
        chat = not isinstance(prompts[0], str)
        completion_objs = [[{"role": "assistant", "content": t}] if chat else t for t in texts]
        columns = {k: [rows[i // g][k] for i in range(len(full))] for k in rows[0] if k != "prompt"}
        scores = np.array(
            [
                f(prompts=prompts, completions=completion_objs, completion_ids=completions, **columns)
                for f in self.reward_funcs
            ],
            dtype=np.float64,
        ).reshape(len(self.reward_funcs), len(full))
        self._heartbeat = time.monotonic()
        weighted = np.array(self.reward_weights)[:, None] * scores
        # a sample no trained reward function could score (NaN) gets advantage 0 and stays out of its group's
        # mean and std, as in TRL's worker; functions of weight 0 (logged only) do not count
        trained = np.array(self.reward_weights) != 0
        rewards = np.where(np.isnan(weighted[trained]).all(0), np.nan, np.nansum(weighted[trained], 0))
        advantages = group_advantages(rewards, g)
        samples = []
        for i, ids in enumerate(full):
            n_prompt = len(prompt_ids[i // g])
            samples.append(
                RolloutSample(
                    prompt=prompts[i],
                    completion=completion_objs[i],
                    input_ids=np.asarray(ids, dtype=np.int64),
                    completion_mask=np.asarray([0] * n_prompt + [1] * (len(ids) - n_prompt), dtype=np.int64),
                    old_log_probs=logps[i],
                    advantage=float(advantages[i]),
                    model_version=version,
                    group_id=self._group_id + i // g,
                    metrics={"reward": float(rewards[i])},
                    enqueued_at=time.time(),
                )
            )
        self._group_id += groups
        metrics = {
            f"rewards/{name}/mean": float(np.nanmean(s))
            for name, s in zip(self.reward_names, scores, strict=True)
        }
        metrics["completions/mean_length"] = float(np.mean([len(c) for c in completions]))
        metrics["rollout/generated_version_mean"] = float(version)
        return samples, metrics

    def _behaviour_logprobs(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """log pi_behaviour of every token given its prefix (temperature-scaled, as the trainer's fused head),
        aligned with the tokens (position 0 has none: 0)."""
        width = max(map(len, sequences))
        ids = torch.full((len(sequences), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        positions = torch.arange(width).expand_as(ids)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
        logps = torch.log_softmax(logits[:, :-1] / self.args.temperature, dim=-1)
        taken = logps.gather(-1, ids[:, 1:, None])[..., 0]
        out = []
        for i, s in enumerate(sequences):
            out.append(np.concatenate([[0.0], taken[i, : len(s) - 1].numpy()]).astype(np.float32))
        return out


def group_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """TRL's worker's advantages: (r - mean) / (std + 1e-8) within each group of ``group_size`` consecutive
    samples (population std); a NaN reward (nothing could score the sample) gets 0 and stays out of the mean
    and std."""
    advantages = np.zeros_like(rewards, dtype=np.float64)
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        scored = ~np.isnan(group)
        if scored.any():
            values = group[scored]
            advantages[start : start + group_size][scored] = (values - values.mean()) / (values.std() + 1e-8)
    return advantages


def _until_eos(tokens: list[int], eos_token_ids: list[int]) -> list[int]:
    """The completion up to and including its first EOS (the padding after it dropped); one without an EOS
    ran to the length limit and has no padding: unchanged."""
    for i, token in enumerate(tokens):
        if token in eos_token_ids:
            return tokens[: i + 1]
    return tokens


def _left_padding(tokenizer: Any) -> Any:
    import copy

    tok = copy.copy(tokenizer)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


class InProcessWeightTransfer:
    """`WeightTransferProtocol` for `InProcessRolloutWorker`: every sync hands the worker a copy of the
    parameters (TRL streams the live tensors, so they are cloned here)."""

    def __init__(self, worker: InProcessRolloutWorker):
        self.worker = worker
        self.syncs = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator) -> None:
        self.worker.receive_weights({name: t.detach().to("cpu", copy=True) for name, t in iterator})
        self.syncs += 1

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


__all__ = ["InProcessRolloutWorker", "InProcessWeightTransfer", "RolloutWorkerError"]
