"""The HH-RLHF recipe's pieces: HH data to prompts, the pairwise reward model, hub checks, the methods
compared."""
