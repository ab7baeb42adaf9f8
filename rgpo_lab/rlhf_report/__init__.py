"""The paper's RLHF table (Sec. 7.3) beside ours, from a suite's results folder, plus the gold score and the
held-out evaluation the paper does not have, and the figures.

    python -m rgpo_lab.rlhf_report results/rlhf/tiny-paper [--out results/rlhf/tiny-paper/report]
    python -m rgpo_lab.rlhf_report results/rlhf --studies   # tune/ final/ frontier/ reuse/ together

Run from the repository root of a checkout (cd <checkout> first, or PYTHONPATH=<checkout>): the lab is not
installed with the package, and elsewhere Python finds no module rgpo_lab.

Reads only ``<method>__s<seed>/{summary.json, heldout.json, metrics.csv}`` (or ``metrics.jsonl``, the same
rows; results/ keeps the CSV). Per method: mean +- sample std (ddof 1) over the finished seeds (n stated) of
the window averages (the paper's iterations 300-400) of the proxy reward, KL_ref and gold, and of the held-out
proxy reward, gold and KL_ref. Methods with no finished run are listed as not run. Figures: reward and KL_ref
per iteration (mean +- 1 std over seeds), the reward-KL_ref Pareto plot (seeds small, means large) and gold
against sqrt(KL_ref) per method (over-optimisation curves).

With the ``sft`` baseline (the initial policy through the same evaluation) it also writes what the gold score
adds: each method's gold minus the SFT policy's gold (Welch 95% interval over seeds), in the pre-registered
window and at the method's best 25-iteration bin (picked after seeing the curve, so optimistic), and whether
the proxy-gold gap grows with KL_ref: per 25-iteration bin of every online run, the proxy shift minus the gold
shift from the SFT policy, each in units of the SFT policy's per-sample std, against KL_ref (Spearman).
Pairwise tests: two-sided Welch, Holm-corrected within each family (every method vs the SFT policy; RGPO vs
every other method), on held-out gold, window gold and held-out KL_ref.
"""

# The modules: runs (a suite folder read back), comparison (one suite's table, gold and pairwise tests),
# dynamics (what the window means hide), studies (frontiers and batch reuse across suites), staleness (the
# staleness study's section), figures, and build (report.md and the JSON files, the command line). The
# mismatch study's own report: mismatch (`python -m rgpo_lab.rlhf_report.mismatch`, also reached by its old
# path rgpo_lab.rlhf_mismatch_report), mismatch_runs, mismatch_verdicts, mismatch_markdown, mismatch_figures.
# The synchronous mismatch study's: sync_mismatch (`python -m rgpo_lab.rlhf_report.sync_mismatch`),
# sync_mismatch_runs, sync_mismatch_verdicts, sync_mismatch_markdown (reusing the asynchronous study's parts).
