"""The recipe's checks of what transformers, TRL and torch would otherwise refuse late: the numeric fields it
passes on (`check_field_ranges`, run on the parsed values before any config is built) and the checkpoint
folder of ``--resume_from_checkpoint`` (`check_resume_checkpoint`). Without them a bad learning rate fails in
torch's optimizer and a corrupt checkpoint file in the Trainer's resume, after the models have loaded and
the output folder exists, with a long traceback; here each is a ``ValueError`` naming the field (and the
allowed range) or the file (and what to do), which the recipe reports on one line."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rgpo_trl.cli import UsageError

Rule = tuple[Callable[[Any], bool], str]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_at_least(low: int) -> Rule:
    return (lambda v: _is_int(v) and v >= low), f"an integer >= {low}"


def _finite(test: Callable[[float], bool], allowed: str) -> Rule:
    return (lambda v: _is_number(v) and math.isfinite(v) and test(v)), allowed


# field -> (accepts the value, what is allowed); None passes (an unset optional field), a field the run's
# parser does not have (DPOConfig has no num_generations) is not checked
FIELD_RULES: dict[str, Rule] = {
    "learning_rate": _finite(lambda v: v > 0, "a finite number > 0"),
    "per_device_train_batch_size": _int_at_least(1),
    "gradient_accumulation_steps": _int_at_least(1),
    "num_generations": (
        lambda v: _is_int(v) and v >= 2,
        "an integer >= 2 (GRPO's advantage compares the completions of one prompt)",
    ),
    "generation_batch_size": _int_at_least(1),
    "steps_per_generation": _int_at_least(1),
    "max_prompt_length": _int_at_least(1),
    "max_completion_length": _int_at_least(1),
    "num_iterations": _int_at_least(1),
    "num_rl_iterations": _int_at_least(1),
    "max_steps": (
        lambda v: _is_int(v) and (v >= 1 or v == -1),
        "an integer >= 1, or -1 (the default: num_rl_iterations iterations)",
    ),
    "temperature": _finite(lambda v: v > 0, "a finite number > 0"),
    "top_p": _finite(lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "weight_decay": _finite(lambda v: v >= 0, "a finite number >= 0"),
    "max_grad_norm": _finite(lambda v: v >= 0, "a finite number >= 0 (0: no clipping)"),
    "adam_beta1": _finite(lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_beta2": _finite(lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_epsilon": _finite(lambda v: v >= 0, "a finite number >= 0"),
    "reward_batch_size": _int_at_least(1),
    "reward_max_length": _int_at_least(1),
    "max_train_prompts": _int_at_least(1),
    "heldout_prompts": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 disables)"),
    "table_every": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0: no table)"),
    "window_start": _int_at_least(0),
    "window_end": _int_at_least(1),
}


def check_field_ranges(values: Mapping[str, Any]) -> None:
    """Refuse the first value of ``values`` (field name -> parsed value, e.g. the parser's namespace) outside
    its `FIELD_RULES` range, naming the field and the range. Run before the configs are built: TRL's
    GRPOConfig divides by ``num_generations`` in its ``__post_init__``, and transformers and torch check the
    others only once training starts."""
    for name, (accepts, allowed) in FIELD_RULES.items():
        value = values.get(name)
        if value is not None and not accepts(value):
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
    start, end = values.get("window_start"), values.get("window_end")
    if start is not None and end is not None and start >= end:
        raise ValueError(
            f"window_start must be below window_end (the window is window_start < iteration <= window_end), "
            f"got {start} and {end}"
        )


def check_async_batch(training_args) -> None:
    """The asynchronous worker produces whole groups per optimizer step: its samples per step must be a
    multiple of ``num_generations`` (refused here rather than when the worker is built, after the models)."""
    samples = (
        training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
        * max(1, training_args.world_size)
    )
    if samples % training_args.num_generations:
        raise ValueError(
            f"per_device_train_batch_size x gradient_accumulation_steps x processes = {samples} must be a "
            f"multiple of num_generations = {training_args.num_generations} (whole groups per step)"
        )


def _corrupt(path: str, folder: str, what: str) -> ValueError:
    return ValueError(
        f"{path}: {what}: the checkpoint is corrupt; delete the checkpoint folder {folder} or point "
        "--resume_from_checkpoint at another one"
    )


def _read_json_object(path: str, folder: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except ValueError as err:  # json.JSONDecodeError, and UnicodeDecodeError for a binary file
        raise _corrupt(path, folder, f"not valid JSON ({err})") from err
    if not isinstance(state, dict):
        raise _corrupt(path, folder, f"holds a JSON {type(state).__name__}, not an object")
    return state


def check_resume_checkpoint(folder: str, training_args) -> None:
    """Refuse a ``--resume_from_checkpoint`` folder the Trainer would fail on after the models load: missing,
    without ``trainer_state.json``, with a JSON file that does not parse (or a trainer state transformers
    cannot read), a safetensors file whose header does not cover the file (truncated), or a saved KL
    controller state the run's controller refuses (another controller, a coefficient outside its bounds)."""
    if not os.path.isdir(folder):
        raise ValueError(
            f"resume_from_checkpoint={folder!r} is not a folder: give a checkpoint folder "
            "(<output_dir>/checkpoint-<step>)"
        )
    # imported here: a resumed run only
    from safetensors import SafetensorError, safe_open
    from transformers.trainer_callback import TrainerState

    state_path = os.path.join(folder, "trainer_state.json")
    if not os.path.isfile(state_path):
        raise ValueError(
            f"{state_path} not found: {folder} is not a Trainer checkpoint; point --resume_from_checkpoint "
            "at one (<output_dir>/checkpoint-<step>)"
        )
    names = sorted(os.listdir(folder))
    states = {
        name: _read_json_object(os.path.join(folder, name), folder)
        for name in names
        if name.endswith(".json")
    }
    if not _is_int(states["trainer_state.json"].get("global_step")):
        raise _corrupt(state_path, folder, "its global_step is missing or not an integer")
    try:
        TrainerState(**states["trainer_state.json"])
    except TypeError as err:  # a key TrainerState does not have
        raise _corrupt(state_path, folder, f"not a Trainer state ({err})") from err
    for name in names:
        if name.endswith(".safetensors"):
            path = os.path.join(folder, name)
            try:
                with safe_open(path, framework="pt"):
                    pass
            except (SafetensorError, OSError) as err:
                raise _corrupt(path, folder, f"unreadable ({err})") from err
    kl_state = states.get("rgpo_kl_controller.json")
    if kl_state is not None and hasattr(training_args, "make_kl_controller"):
        try:
            training_args.make_kl_controller().load_state_dict(kl_state)
        except ValueError as err:
            raise ValueError(
                f"{os.path.join(folder, 'rgpo_kl_controller.json')}: {err}: resume with the same "
                "kl_controller and bounds, or point --resume_from_checkpoint at another checkpoint"
            ) from err


@contextmanager
def checkpoint_load_errors(folder: str | None) -> Iterator[None]:
    """Around ``trainer.train(resume_from_checkpoint=folder)``: a weights file that passed
    `check_resume_checkpoint` but fails to load (changed since, or damaged inside its tensors) raises
    safetensors' error, which names no file; it becomes a `UsageError` naming the folder's safetensors
    files."""
    from safetensors import SafetensorError  # imported here: with the Trainer's own import of it

    try:
        yield
    except SafetensorError as err:
        if folder is None:
            raise
        files = [n for n in sorted(os.listdir(folder)) if n.endswith(".safetensors")]
        named = ", ".join(os.path.join(folder, n) for n in files) or f"the weights in {folder}"
        raise UsageError(str(_corrupt(named, folder, f"failed to load ({err})"))) from err
