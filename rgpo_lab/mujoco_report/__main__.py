"""`python -m rgpo_lab.mujoco_report <results> --out <dir>` (see the package docstring)."""

from rgpo_lab.mujoco_report.build import main

if __name__ == "__main__":
    main()
