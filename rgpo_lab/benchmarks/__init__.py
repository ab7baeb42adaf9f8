"""Speed, cost and equivalence checks behind the numbers in docs/benchmarks.md and docs/mujoco.md, each run as
``python -m rgpo_lab.benchmarks.<module> [--help]`` from the repository root. Each compares two or more things
in one run and writes its command, machine and result to results/benchmarks/ (``--out`` elsewhere).

MuJoCo scripts, speed and cost: mujoco_compile (``--compile`` against the eager scripts at ``--baseline-ref``,
and CleanRL's PPO beside it), mujoco_speed (against CleanRL's ppo_continuous_action.py; the RGPO / PPO
update ratio), env_wrappers (the scripts' environment against gymnasium's wrappers), compiled_steps_per_call,
trpo_fvp (Fisher-vector products), mujoco_rollout (per-step rollout paths), mujoco_profile (where a step's
time goes), script_compile (the single-file scripts' ``--compile`` against
the same script eager and the scripts at 5d1a668).

MuJoCo learning outcomes: compile_equivalence (reads the grid suite ``compile_equiv``),
check_mujoco_path_divergence (where the eager and ``--compile`` rollouts of one seed part ways).

Trainers: trainer_step (RGPOTrainer or PPORLHFTrainer against TRL's GRPOTrainer), async_step
(AsyncRGPOTrainer against TRL's AsyncGRPOTrainer).

The refactors' one-off checks (check_mujoco_bit_identity, count_mujoco_calls, mujoco_refactor) were removed
in issue 48; their outputs stay in results/benchmarks/ with the command and commit that made them, and
``git log -1 -- rgpo_lab/benchmarks/<module>.py`` names the commit that removed one.

common.py holds what they share (the repository root, results/benchmarks/, loading a script, writing a
result).

Importing the package sets what every benchmark needs before its module imports transformers (which reads
HF_HUB_OFFLINE when imported), so the modules keep their imports at the top: the hub offline, tokenizers
single-threaded, and TRL's warning on importing ``trl.experimental`` (async_step compares against TRL's
AsyncGRPOTrainer from there) silenced."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
