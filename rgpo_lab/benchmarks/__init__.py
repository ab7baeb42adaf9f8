"""Speed, cost and equivalence checks behind the numbers in docs/benchmarks.md and docs/mujoco.md, each run as
``python -m rgpo_lab.benchmarks.<module> [--help]`` from the repository root. Each compares two or more things
in one run and writes its command, machine and result to results/benchmarks/ (``--out`` elsewhere).

MuJoCo scripts: script_compile (the single-file scripts' ``--compile`` against the same script eager and the
scripts at 5d1a668); compile_equivalence (learning outcomes, eager vs ``--compile``: reads the grid suite
``compile_equiv``). The benchmarks of the lab's former copy of the algorithms (mujoco_compile, mujoco_speed,
env_wrappers, compiled_steps_per_call, trpo_fvp, mujoco_rollout, mujoco_profile, check_mujoco_path_divergence)
left with it in issue 59; their outputs stay in results/benchmarks/, each command runnable at 6944b5d
(results/benchmarks/README.md).

Trainers: trainer_step (RGPOTrainer or PPORLHFTrainer against TRL's GRPOTrainer), async_step
(AsyncRGPOTrainer against TRL's AsyncGRPOTrainer), gpu_step (the GPU step-time and memory benchmark that
``.ci/run_gpu`` runs; ``--tiny`` on CPU).

The refactors' one-off checks (check_mujoco_bit_identity, count_mujoco_calls, mujoco_refactor) were removed
in issue 48; their outputs stay in results/benchmarks/ with the command and commit that made them, and
``git log -1 -- rgpo_lab/benchmarks/<module>.py`` names the commit that removed one.

common.py holds what they share (the repository root, results/benchmarks/, writing a result).

Importing the package sets what every benchmark needs before its module imports transformers (which reads
HF_HUB_OFFLINE when imported), so the modules keep their imports at the top: the hub offline, tokenizers
single-threaded, and TRL's warning on importing ``trl.experimental`` (async_step compares against TRL's
AsyncGRPOTrainer from there) silenced."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
