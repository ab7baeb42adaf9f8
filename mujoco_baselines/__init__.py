"""The MuJoCo baselines: four single-file scripts in CleanRL's structure,
``{ppo,rgpo,trpo,awr}_continuous_action.py``, each read top to bottom (Args, environment, agent, rollout, GAE,
update, logging) and importing from the library only the loss, the gates and the KL controller. Nothing here
is shared between them: this file only makes the directory installable, so that ``python -m
mujoco_baselines.rgpo_continuous_action`` works from an installed wheel as ``python
mujoco_baselines/rgpo_continuous_action.py`` does from a checkout. The lab's grid runs these files as they are
(rgpo_lab.mujoco_drive)."""
