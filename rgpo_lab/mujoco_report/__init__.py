"""The paper's MuJoCo tables and figures from a results directory, next to the paper's own numbers.

    python -m rgpo_lab.mujoco_report results/mujoco --out results/mujoco/report

Reads only ``<results>/<suite>/<run>/{config.json, metrics.csv, final.json}`` (as written by
``mujoco_grid.py``) and the suite definitions in ``mujoco_grid.py`` (to list the runs that have not run yet).
Writes ``<out>/report.md``, one CSV per table and the figures as PNG. Only finished runs (with ``final.json``)
enter a table; the others are counted as in progress or not run, never filled in.

Statistics (per run first, then across seeds; n = number of finished seeds, stated in every cell):
- final return: mean of the run's last 100 episodes (``final.json``); mean +- sample std (ddof = 1) over
  seeds; RGPO vs PPO: one-tailed Welch t-test (H1: RGPO > PPO), as the paper;
- KL: ``kl`` = mean over the iteration's mini-batches of mean(r - 1 - log r) before each update, ``kl_final``
  = the iteration's final policy against pi_old over the whole batch; mean over iterations and seeds, max over
  iterations and seeds, spike rate = share of iterations with KL > 0.04 (2 x target);
- ESS, gradient variance: mean over iterations and seeds;
- beyond the paper (the rliable protocol of Agarwal et al. 2021, computed with scipy because rliable 1.2 needs
  arch < 8, whose 7.x releases fail to import with pandas 3, and pinning pandas < 3 for every user of the
  extra would be worse): interquartile mean (IQM) of PPO-normalised final returns (each run divided by the
  mean of the PPO runs of its environment) with a stratified-bootstrap 95% CI (runs resampled within each
  environment), and the probability of improvement P(RGPO > PPO) (Mann-Whitney U / (n m), averaged over
  environments) with its stratified-bootstrap 95% CI. Where the reference mean is within one std of 0
  (constant-rate PPO on Ant, found after those runs), a min-max normalised aggregate (each environment's
  worst run of the study -> 0, best -> 1) is added beside the pre-registered one.
"""

# The modules, by study: runs (the results folder read back), cells (how a number is written), paper_tables
# (the paper's tables beside its numbers), studies ("when does RGPO help?"), policy_lag (stale samples),
# eager_vs_compiled, figures, and build (report.md, the CSV and JSON files, the command line). The
# policy_lag_confirm report (python -m rgpo_lab.mujoco_confirm_report) is confirm.py and the modules it builds
# from: confirm_runs (the suite read), confirm_statistics, confirm_reading (provenance, status, the rule's
# words), confirm_md (a function per section), confirm_curves, and code_path (a commit's code path).
