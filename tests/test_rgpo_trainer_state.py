"""RGPOTrainer's state is its own: it sets no attribute that GRPOTrainer or transformers' Trainer create
(recorded through training with the adaptive entropy bonus, a checkpoint and a resume), and its adaptive
entropy controller (GRPOTrainer's rule on RGPO's `EntropyControllerState`) survives a checkpoint: a resumed
run continues the uninterrupted run's ``entropy_coef`` sequence. GRPOTrainer's public ``entropy_coef`` is the
coefficient in force throughout (TRL's adaptive-entropy tests, on RGPOTrainer)."""

from __future__ import annotations

import inspect
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from _trainer_utils import (
    attach_recorder,
    base_args,
    tiny_dataset,
    tiny_tokenizer,
    vowel_reward,
)
from transformers import TrainerCallback
from trl import GRPOTrainer

import rgpo_trl
from rgpo_trl import RGPOConfig, RGPOTrainer
from rgpo_trl.trainer.trainer import ENTROPY_CONTROLLER_FILE, KL_CONTROLLER_FILE, EntropyControllerState

torch.set_num_threads(1)

RGPO_SOURCE = str(Path(rgpo_trl.__file__).parent)
# GRPOTrainer's own controller rule; entropy_target 100 lies above any entropy of the tiny vocabulary, so the
# coefficient steps up by delta at every optimizer step: 0.05 -> 0.07 -> 0.09 -> 0.11 -> 0.13
ADAPTIVE = dict(use_adaptive_entropy=True, entropy_coef=0.05, entropy_target=100.0, entropy_coef_delta=0.02)


class _RecordingTrainer(RGPOTrainer):
    """Records every attribute assignment from construction on, with the source file of the code making it."""

    def __setattr__(self, name, value):
        self.__dict__.setdefault("_assignments", []).append((name, sys._getframe(1).f_code.co_filename))
        super().__setattr__(name, value)


def make_trainer(model_path, output_dir, cls=RGPOTrainer, **overrides):
    options = dict(
        max_steps=4,
        max_completion_length=16,
        gradient_accumulation_steps=2,  # an entropy window of two micro-batches
        save_strategy="steps",
        save_steps=2,
        **ADAPTIVE,
    )
    args = RGPOConfig(**base_args(output_dir, **{**options, **overrides}))
    tokenizer = tiny_tokenizer()
    tokenizer.eos_token = "e"  # completions of different lengths: windows of different token counts
    return cls(model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tokenizer)


class _ControllerSnapshots(TrainerCallback):
    """The entropy controller's (coefficient, last world entropy) after every optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.states = trainer, []
        trainer.add_callback(self)

    def on_step_end(self, args, state, control, **kwargs):
        ctl = self.trainer.entropy_ctl
        self.states.append((ctl.coef, ctl.last_world_entropy))


def _logged(trainer, key, after_step=0):
    """``key``'s logged values after ``after_step`` (a resumed run's history starts with the checkpoint's)."""
    return [e[key] for e in trainer.state.log_history if key in e and e["step"] > after_step]


def _assigned_in_source(cls) -> set[str]:
    """The names ``cls``'s own source assigns as ``self.<name> = ...`` (or augmented, or annotated)."""
    pattern = r"\bself\.(\w+)\s*(?::[^=\n]+)?(?:[-+*/%|&^@]|//|\*\*|<<|>>)?=(?!=)"
    return set(re.findall(pattern, inspect.getsource(cls)))


def test_rgpo_trainer_sets_no_attribute_of_grpo_trainer_or_trainer(model_path, tmp_path):
    """GRPOTrainer's and Trainer's attributes: those their classes' source assigns, and those any code outside
    rgpo_trl was seen assigning here. RGPO's code (rgpo_trl) assigns none of them, in construction, a short
    run with the adaptive entropy bonus, a checkpoint, a resume from it and an evaluation."""
    owned = set().union(*(_assigned_in_source(c) for c in GRPOTrainer.__mro__ if c is not object))
    assert {"entropy_coef", "_last_world_entropy", "_entropy_window_stats", "state", "optimizer"} <= owned

    full = make_trainer(model_path, tmp_path / "full", cls=_RecordingTrainer)
    full.train()
    resumed = make_trainer(model_path, tmp_path / "resumed", cls=_RecordingTrainer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    resumed.evaluate(tiny_dataset())

    ours, theirs = set(), set()
    for trainer in (full, resumed):
        for name, filename in trainer.__dict__["_assignments"]:
            (ours if filename.startswith(RGPO_SOURCE) else theirs).add(name)
    assert "entropy_ctl" in ours and "kl_ctl" in ours  # the recorder sees RGPO's own assignments
    assert "entropy_coef" in theirs and "_last_world_entropy" in theirs  # ... and GRPOTrainer's
    assert not ours & (owned | theirs), f"RGPOTrainer sets attributes of GRPOTrainer/Trainer: {ours & owned}"

    for trainer in (full, resumed):
        # GRPOTrainer's private controller state is as its __init__ left it (its own checkpoint restores it)
        assert trainer._last_world_entropy == math.inf and trainer._entropy_window_stats is None
        # RGPO's moved: four optimizer steps up by delta; the public entropy_coef is a view of it, not stored
        assert trainer.entropy_ctl.coef == pytest.approx(0.13) == trainer.entropy_coef
        assert "entropy_coef" not in vars(trainer)
        assert math.isfinite(trainer.entropy_ctl.last_world_entropy)


def test_adaptive_entropy_controller_survives_a_checkpoint(model_path, tmp_path):
    """4 steps uninterrupted vs 2 steps, checkpoint, resume for 2: the resumed run continues the uninterrupted
    one's entropy_coef sequence and its applied bonus (its loss), and ends in the same controller state."""
    full = make_trainer(model_path, tmp_path / "full")
    full_states = _ControllerSnapshots(full).states
    full_records = attach_recorder(full)
    full.train()
    coefs = _logged(full, "entropy_coef")
    assert coefs == pytest.approx([0.07, 0.09, 0.11, 0.13])
    assert [c for c, _ in full_states] == coefs

    ckpt = tmp_path / "full" / "checkpoint-2"
    saved = json.loads((ckpt / ENTROPY_CONTROLLER_FILE).read_text())
    assert (saved["entropy_coef"], saved["last_world_entropy"]) == full_states[1]
    # GRPOTrainer's own file holds the coefficient in force too (read through entropy_coef)
    assert json.loads((ckpt / "entropy_ctrl_state.json").read_text())["entropy_coef"] == full_states[1][0]

    resumed = make_trainer(model_path, tmp_path / "resumed")
    resumed_states = _ControllerSnapshots(resumed).states
    resumed_records = attach_recorder(resumed)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.state.global_step == 4
    # Without the restore the coefficient would restart at 0.05 (logging 0.07, 0.09) and step 3 would apply no
    # bonus (no window measured yet).
    assert _logged(resumed, "entropy_coef", after_step=2) == coefs[2:]
    # (coefficient, entropy) pairs: approx takes flat sequences only (pytest >= 9.2 refuses nested ones)
    assert len(resumed_states) == len(full_states[2:]) == 2
    for ours, theirs in zip(resumed_states, full_states[2:], strict=True):
        assert ours == pytest.approx(theirs, rel=1e-6)
    # the resumed micro-batches are the uninterrupted run's last four, with the same bonus applied
    assert len(resumed_records) == 4 and len(full_records) == 8
    for ours, theirs in zip(resumed_records, full_records[4:], strict=True):
        assert torch.equal(ours["inputs"]["completion_ids"], theirs["inputs"]["completion_ids"])
        torch.testing.assert_close(ours["loss"], theirs["loss"], atol=1e-6, rtol=0)


class _PublicCoefficient(TrainerCallback):
    """What a user callback sees: (``trainer.entropy_coef``, the controller's coefficient) when training
    starts (after a resume's checkpoint is loaded) and after every optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.seen = trainer, []
        trainer.add_callback(self)

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen.append((self.trainer.entropy_coef, self.trainer.entropy_ctl.coef))

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append((self.trainer.entropy_coef, self.trainer.entropy_ctl.coef))


@pytest.mark.parametrize(
    ("entropy_target", "accumulation", "expected"),
    [
        # every window's entropy lies above a target of 0: down by delta per step to entropy_coef_min (0)
        (0.0, 1, [0.03, 0.01, 0.0, 0.0]),
        # ... and below a target of 100: up by delta per step
        (100.0, 2, [0.07, 0.09, 0.11, 0.13]),
    ],
    ids=["adaptive_entropy", "adaptive_entropy_gradient_accumulation"],
)
def test_train_with_adaptive_entropy(model_path, tmp_path, entropy_target, accumulation, expected):
    """TRL's test_train_with_adaptive_entropy and its gradient-accumulation twin on RGPOTrainer: the public
    ``entropy_coef`` (which those tests and user callbacks read) moves from the config's 0.05 by
    entropy_coef_delta per optimizer step (GRPOTrainer's rule, by hand: ``expected``) and equals the
    controller's coefficient at every step, at the end, and when a resumed run starts from a checkpoint."""
    options = dict(gradient_accumulation_steps=accumulation, entropy_target=entropy_target)
    full = make_trainer(model_path, tmp_path / "full", **options)
    full_seen = _PublicCoefficient(full).seen
    full.train()
    assert [public for public, _ in full_seen] == pytest.approx([0.05, *expected], abs=1e-12)
    assert all(public == ctl for public, ctl in full_seen)
    assert full.entropy_coef == full.entropy_ctl.coef != 0.05
    assert _logged(full, "entropy_coef") == [public for public, _ in full_seen[1:]]

    resumed = make_trainer(model_path, tmp_path / "resumed", **options)
    resumed_seen = _PublicCoefficient(resumed).seen
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    # the checkpoint's coefficient from the first moment, then the uninterrupted run's sequence
    assert [public for public, _ in resumed_seen] == pytest.approx(expected[1:], abs=1e-12)
    assert all(public == ctl for public, ctl in resumed_seen)
    assert resumed.entropy_coef == resumed.entropy_ctl.coef == full.entropy_coef


def test_entropy_coef_written_by_a_user_is_the_coefficient_in_force(model_path, tmp_path):
    """GRPOTrainer's attribute is writable; on RGPOTrainer a write sets the controller's coefficient (the next
    step's rule starts from it)."""
    trainer = make_trainer(model_path, tmp_path, max_steps=1, save_strategy="no")
    trainer.entropy_coef = 0.5
    assert trainer.entropy_ctl.coef == 0.5 and "entropy_coef" not in vars(trainer)
    trainer.train()
    assert trainer.entropy_coef == trainer.entropy_ctl.coef == pytest.approx(0.52)


def test_resume_refuses_a_corrupt_or_mismatched_entropy_controller_file_and_warns_on_a_missing_one(
    model_path, tmp_path
):
    make_trainer(model_path, tmp_path / "full", max_steps=2).train()
    ckpt = tmp_path / "full" / "checkpoint-2"
    path = ckpt / ENTROPY_CONTROLLER_FILE
    saved = json.loads(path.read_text())
    resume = dict(save_strategy="no")

    path.write_text("{not json")
    broken = make_trainer(model_path, tmp_path / "broken", **resume)
    with pytest.raises(
        ValueError, match=f"{ENTROPY_CONTROLLER_FILE} is not valid JSON.*checkpoint is corrupt"
    ):
        broken.train(resume_from_checkpoint=str(ckpt))
    assert broken.state.global_step == 2 and broken.entropy_ctl.coef == 0.05  # refused before any step

    path.write_text(json.dumps(saved))  # saved coefficient 0.09, outside the resumed run's bounds
    narrower = make_trainer(model_path, tmp_path / "narrower", entropy_coef_max=0.08, **resume)
    with pytest.raises(
        ValueError,
        match=rf"{ENTROPY_CONTROLLER_FILE}: saved entropy_coef 0\.09\d* is outside.*same entropy_coef_min",
    ):
        narrower.train(resume_from_checkpoint=str(ckpt))
    assert narrower.entropy_ctl.coef == 0.05 and narrower.entropy_ctl.last_world_entropy == math.inf

    path.write_text(json.dumps({**saved, "last_world_entropy": "low"}))
    with pytest.raises(ValueError, match="last_world_entropy must be a number or null"):
        make_trainer(model_path, tmp_path / "typed", **resume).train(resume_from_checkpoint=str(ckpt))

    path.unlink()
    missing = make_trainer(model_path, tmp_path / "missing", **resume)
    with pytest.warns(UserWarning, match=f"{ENTROPY_CONTROLLER_FILE} not found: the adaptive entropy"):
        missing.train(resume_from_checkpoint=str(ckpt))
    # restarted at 0.05 with no window measured: steps 3 and 4 log 0.07, 0.09
    assert _logged(missing, "entropy_coef", after_step=2) == pytest.approx([0.07, 0.09])
    assert (ckpt / KL_CONTROLLER_FILE).exists()


def test_only_the_adaptive_controller_is_checkpointed(model_path, tmp_path):
    """A static coefficient never changes: as GRPOTrainer, no entropy controller file then."""
    trainer = make_trainer(model_path, tmp_path, max_steps=2, use_adaptive_entropy=False, entropy_coef=0.1)
    trainer.train()
    assert _logged(trainer, "entropy_coef") == [0.1, 0.1] and trainer.entropy_ctl.coef == 0.1
    assert not (tmp_path / "checkpoint-2" / ENTROPY_CONTROLLER_FILE).exists()
    assert (tmp_path / "checkpoint-2" / KL_CONTROLLER_FILE).exists()


def test_entropy_controller_state_round_trips_through_strict_json():
    ctl = EntropyControllerState(coef=0.3, coef_min=0.0, coef_max=1.0)
    assert ctl.state_dict() == {"entropy_coef": 0.3, "last_world_entropy": None}  # inf: no window yet
    json.dumps(ctl.state_dict(), allow_nan=False)
    restored = EntropyControllerState(coef=0.0, coef_min=0.0, coef_max=1.0, last_world_entropy=2.0)
    restored.window = torch.ones(2)
    restored.load_state_dict(ctl.state_dict())
    assert (restored.coef, restored.last_world_entropy, restored.window) == (0.3, math.inf, None)
    restored.load_state_dict({"entropy_coef": 1, "last_world_entropy": 2.5})
    assert (restored.coef, restored.last_world_entropy) == (1.0, 2.5)
    for bad in ({"entropy_coef": True, "last_world_entropy": None}, {"last_world_entropy": None}):
        with pytest.raises(ValueError, match="saved entropy_coef"):
            restored.load_state_dict(bad)
    with pytest.raises(ValueError, match="last_world_entropy"):
        restored.load_state_dict({"entropy_coef": 0.5})
    assert (restored.coef, restored.last_world_entropy) == (1.0, 2.5)  # refused whole
