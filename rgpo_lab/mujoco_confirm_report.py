"""`python -m rgpo_lab.mujoco_confirm_report`, the command the committed report names: the policy_lag_confirm
report, built by rgpo_lab.mujoco_report.confirm."""

from rgpo_lab.mujoco_report.confirm import main

if __name__ == "__main__":
    raise SystemExit(main())
