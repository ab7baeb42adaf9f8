"""The lab's MuJoCo runner: the four methods (PPO, RGPO, TRPO, AWR) with what only the studies need around
them (``--compile``'s compiled update, checkpoints and resume, metrics.csv / config.json / final.json, the
deterministic evaluation, the stale-sample statistics), as the committed results under results/mujoco were
made. The same algorithm as the single-file scripts in ``mujoco_baselines/`` (the product), eager run for
eager run: tests/test_mujoco_script_vs_lab.py checks each script against this runner on the same seed.

    python -m rgpo_lab.mujoco_runner rgpo --env-id Hopper-v4 --compile     # or ppo | trpo | awr
    python -m rgpo_lab.mujoco_runner.rgpo_continuous_action --help          # the same, by module

Moved here from ``mujoco_baselines/`` in issue 48 with its code unchanged (import paths and texts only), so a
run of the suites made at an earlier commit is on this code path (rgpo_lab.mujoco_confirm_report's
``same_code_path`` compares the two layouts). Each module keeps its file name: ``exp_name`` (config.json,
final.json's ``method``) is still ``<method>_continuous_action``. The grid (``rgpo_lab.mujoco_grid``) starts
its runs here; the reports read their output."""

from rgpo_trl.core.kl_control import PAPER_KL_DEFAULTS

# A 'KL spike' is an iteration whose KL to pi_old exceeds twice the KL controller's target (the paper's, in
# rgpo_trl.core.PAPER_KL_DEFAULTS): every script's --spike-kl default and the report's threshold. Here rather
# than in common.py so that the report reads it without importing gymnasium and MuJoCo.
SPIKE_KL = 2 * PAPER_KL_DEFAULTS["kl_target"]
