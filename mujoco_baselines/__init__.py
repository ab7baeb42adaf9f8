"""CleanRL-style single-file MuJoCo baselines (PPO, RGPO, TRPO, AWR), their shared module (`common`) and the fast
path (`compiled_update`); the grid runner and the report are the lab's (`rgpo_lab.mujoco_grid`,
`rgpo_lab.mujoco_report`). Run a script as a file or a module:
``python mujoco_baselines/rgpo_continuous_action.py`` or
``python -m mujoco_baselines.rgpo_continuous_action``."""
