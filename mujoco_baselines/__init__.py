"""The MuJoCo baselines: four scripts (PPO, RGPO, TRPO, AWR), each its method's flags on the shared base
`common.BaseArgs` and its update, read top to bottom in CleanRL's structure; their shared module (`common`:
the other flags, rollout, GAE, logging, checkpoints) and the fast path (`compiled_update`); the grid runner
and the report are the lab's (`rgpo_lab.mujoco_grid`, `rgpo_lab.mujoco_report`). Run a script as a file or
a module: ``python mujoco_baselines/rgpo_continuous_action.py`` or
``python -m mujoco_baselines.rgpo_continuous_action``."""

from rgpo_trl.core.kl_control import PAPER_KL_DEFAULTS

# A 'KL spike' is an iteration whose KL to pi_old exceeds twice the KL controller's target (the paper's, in
# rgpo_trl.core.PAPER_KL_DEFAULTS): every script's --spike-kl default and the report's threshold. Here rather
# than in common.py so that the report reads it without importing gymnasium and MuJoCo.
SPIKE_KL = 2 * PAPER_KL_DEFAULTS["kl_target"]
