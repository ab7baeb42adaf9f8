"""`python -m rgpo_lab.rlhf_report <results> [--studies] [--out <dir>]` (see the package docstring)."""

from rgpo_lab.rlhf_report.build import main

if __name__ == "__main__":
    main()
