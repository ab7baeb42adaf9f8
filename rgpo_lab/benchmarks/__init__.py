"""Speed, cost and equivalence checks behind the numbers in docs/benchmarks.md and docs/mujoco.md, each run as
``python -m rgpo_lab.benchmarks.<module> [--help]`` from the repository root. Each compares two or more things
in one run and writes its command, machine and result to results/benchmarks/ (``--out`` elsewhere).

MuJoCo scripts against an earlier version of themselves (``--baseline-ref``, for refactors):
    check_mujoco_bit_identity   metrics.csv equal as written (exit status 1 if not)
    count_mujoco_calls          Python calls per iteration (load-independent)
    mujoco_refactor             wall-clock time per iteration
    mujoco_compile              ``--compile`` against the eager baseline, and CleanRL's PPO beside it

MuJoCo scripts, speed and cost: mujoco_speed (against CleanRL's ppo_continuous_action.py; the RGPO / PPO
update ratio), env_wrappers (the scripts' environment against gymnasium's wrappers), compiled_steps_per_call,
trpo_fvp (Fisher-vector products), mujoco_rollout (per-step rollout paths), mujoco_profile (where a step's
time goes).

MuJoCo learning outcomes: compile_equivalence (reads the grid suite ``compile_equiv``),
check_mujoco_path_divergence (where the eager and ``--compile`` rollouts of one seed part ways).

Trainers: trainer_step (RGPOTrainer or PPORLHFTrainer against TRL's GRPOTrainer), async_step
(AsyncRGPOTrainer against TRL's AsyncGRPOTrainer).

common.py holds what they share (the repository root, results/benchmarks/, loading a script, writing a
result)."""
