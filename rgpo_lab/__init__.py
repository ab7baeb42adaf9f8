"""The lab around rgpo-trl: what produced the committed results (statistics, suite runners, reports), kept
apart from what users run (the library ``rgpo_trl``, the MuJoCo scripts, the recipe)."""
