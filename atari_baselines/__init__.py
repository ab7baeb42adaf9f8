"""The Atari baselines: two single-file scripts in CleanRL's structure, ``{ppo,rgpo}_atari_envpool.py``
(Nature CNN, envpool), each read top to bottom and importing from the library only the loss, the gates and
the KL controller. Nothing here is shared between them: this file only makes the directory installable, so
that ``python -m atari_baselines.rgpo_atari_envpool`` works from an installed wheel as ``python
atari_baselines/rgpo_atari_envpool.py`` does from a checkout. Docs: docs/atari.md."""
