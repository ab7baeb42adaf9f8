"""The HH-RLHF pieces the recipe (`recipes.hh_rlhf`) and the tiny world (`recipes.tiny_hh`) share: the HH
dialogue format and its loaders (`hh_data`), the pairwise reward model (`rewards`) and the fail-fast hub
checks (`hub_access`). They import neither of the two."""
