"""The mismatch study's report at the path its committed report.md and RULES.md name
(``python -m rgpo_lab.rlhf_mismatch_report``); the code is `rgpo_lab.rlhf_report.mismatch`."""

import sys

from rgpo_lab.rlhf_report.mismatch import build, main

__all__ = ["build", "main"]

if __name__ == "__main__":
    sys.exit(main())
