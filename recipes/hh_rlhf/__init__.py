"""The HH-RLHF recipe's plumbing (run by ``recipes/hh_rlhf_qwen.py``): its arguments and their parsing, the
worlds it runs in, the methods compared, the metrics files, evaluation and the run's end. The HH data, reward
model and hub checks it shares with the tiny world are `recipes.hh_common`'s."""
