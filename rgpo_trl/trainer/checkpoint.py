"""The KL-controller checkpoint file, written and read the same way by `RGPOTrainer` and `AsyncRGPOTrainer`.

The controller's state is plain JSON (`KLController.state_dict`), saved as ``rgpo_kl_controller.json`` next to
the Trainer's own checkpoint files. On resume a missing file warns (the coefficient restarts at the config's
``kl_coef``); a file that is not a JSON object, or whose state the controller refuses (another controller, a
coefficient outside its bounds), raises a ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..core import KLController

KL_CONTROLLER_FILE = "rgpo_kl_controller.json"


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


def save_kl_controller(kl_ctl: KLController, folder: str) -> None:
    """Write the controller's state to ``folder/rgpo_kl_controller.json``."""
    write_json_state(os.path.join(folder, KL_CONTROLLER_FILE), kl_ctl.state_dict())


def load_kl_controller(kl_ctl: KLController, checkpoint: str, coefficient: str = "KL-to-old") -> bool:
    """Restore the controller from ``checkpoint/rgpo_kl_controller.json``. True when restored; False, with a
    warning naming the file, when there is none (the coefficient stays at its initial value). A corrupt file
    or a state the controller refuses raises a ``ValueError`` naming the file; the controller is then
    unchanged. ``coefficient`` names the coefficient in the warning."""
    path = os.path.join(checkpoint, KL_CONTROLLER_FILE)
    if not os.path.exists(path):
        warnings.warn(
            f"{path} not found: the {coefficient} coefficient is not restored and stays at "
            f"kl_coef={kl_ctl.kl_coef}.",
            stacklevel=3,  # the trainer's _load_optimizer_and_scheduler
        )
        return False
    state = read_json_state(path)
    try:
        kl_ctl.load_state_dict(state)
    except ValueError as err:
        raise ValueError(f"{path}: {err}; resume with the same kl_controller and bounds") from err
    return True
