"""CleanRL-style single-file MuJoCo baselines (PPO, RGPO, TRPO, AWR), their shared module (`common`), the fast
path (`compiled_update`), the grid runner and the report. Run a script as a file or a module:
``python mujoco_baselines/rgpo_continuous_action.py`` or
``python -m mujoco_baselines.rgpo_continuous_action``."""
