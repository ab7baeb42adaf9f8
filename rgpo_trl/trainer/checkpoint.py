"""RGPO's checkpoint files, written and read the same way by `RGPOTrainer` and `AsyncRGPOTrainer`.

Each controller's state is plain JSON (its ``state_dict``), saved next to the Trainer's own checkpoint files:
the KL controller's (`KLController.state_dict`) as ``rgpo_kl_controller.json`` by both trainers, and
`RGPOTrainer`'s adaptive entropy controller's (`EntropyControllerState.state_dict`, with
``use_adaptive_entropy``) as ``rgpo_entropy_controller.json``. On resume a missing file warns (the coefficient
restarts at the config's value); a file that is not a JSON object, or whose state the controller refuses
(another controller, a coefficient outside its bounds), raises a ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Protocol

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..core import KLController

KL_CONTROLLER_FILE = "rgpo_kl_controller.json"
ENTROPY_CONTROLLER_FILE = "rgpo_entropy_controller.json"


class Controller(Protocol):
    """What a checkpoint file holds: a state as a JSON object, and its restore (which raises ``ValueError`` on
    a state it refuses, leaving the controller unchanged)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def checkpoint_folder(trainer, trial) -> str:
    """The folder `transformers.Trainer._save_checkpoint` has just written for the current global step."""
    return os.path.join(
        trainer._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    )


def write_json_state(path: str, state: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(state, f, indent=2)


def read_json_state(path: str) -> dict[str, Any]:
    """The JSON object saved in ``path``; a file that does not parse, or holds something else than an object,
    is refused with a ``ValueError`` naming it."""
    try:
        with open(path) as f:
            state = json.load(f)
    except ValueError as err:  # json.JSONDecodeError, and UnicodeDecodeError for a binary file
        raise ValueError(
            f"{path} is not valid JSON ({err}): the checkpoint is corrupt; delete it or resume from another"
        ) from err
    if not isinstance(state, dict):
        raise ValueError(f"{path} should hold a JSON object, found {type(state).__name__}")
    return state


def save_controller(ctl: Controller, folder: str, filename: str) -> None:
    """Write the controller's state to ``folder/filename``."""
    write_json_state(os.path.join(folder, filename), ctl.state_dict())


def load_controller(
    ctl: Controller, checkpoint: str, filename: str, *, missing: str, hint: str, stacklevel: int = 3
) -> bool:
    """Restore the controller from ``checkpoint/filename``. True when restored; False, with the warning
    "<path> not found: <missing>", when there is none. A corrupt file or a state the controller refuses raises
    a ``ValueError`` naming the file and ending with ``hint``; the controller is then unchanged.
    ``stacklevel`` is the warning's, counted from this function (3: past the trainer's method calling it)."""
    path = os.path.join(checkpoint, filename)
    if not os.path.exists(path):
        warnings.warn(f"{path} not found: {missing}", stacklevel=stacklevel)
        return False
    state = read_json_state(path)
    try:
        ctl.load_state_dict(state)
    except ValueError as err:
        raise ValueError(f"{path}: {err}; {hint}") from err
    return True


def save_kl_controller(kl_ctl: KLController, folder: str) -> None:
    """Write the controller's state to ``folder/rgpo_kl_controller.json``."""
    save_controller(kl_ctl, folder, KL_CONTROLLER_FILE)


def load_kl_controller(kl_ctl: KLController, checkpoint: str, coefficient: str = "KL-to-old") -> bool:
    """Restore the controller from ``checkpoint/rgpo_kl_controller.json``. True when restored; False, with a
    warning naming the file, when there is none (the coefficient stays at its initial value). A corrupt file
    or a state the controller refuses raises a ``ValueError`` naming the file; the controller is then
    unchanged. ``coefficient`` names the coefficient in the warning."""
    return load_controller(
        kl_ctl,
        checkpoint,
        KL_CONTROLLER_FILE,
        missing=f"the {coefficient} coefficient is not restored and stays at kl_coef={kl_ctl.kl_coef}.",
        hint="resume with the same kl_controller and bounds",
        stacklevel=4,  # past this wrapper and the trainer's _load_optimizer_and_scheduler, to its caller
    )
