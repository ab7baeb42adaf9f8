"""The recipes around the RGPO library: the HH-RLHF recipe (`recipes.hh_rlhf`, run as
``recipes/hh_rlhf_qwen.py``), the embedded tiny-HH world it runs offline (`recipes.tiny_hh`) and the HH-RLHF
pieces both use (`recipes.hh_common`: the dialogue format and loaders, the pairwise reward model, the hub
checks).

Like the lab (``rgpo_lab``), the recipes are imported from a checkout, not installed (the wheel holds
``rgpo_trl`` and ``mujoco_baselines`` only): run them from the repository root, e.g. ``python -m
recipes.tiny_hh`` or ``accelerate launch recipes/hh_rlhf_qwen.py --config ...``. They depend on the library;
the library never imports them. Layers, each importing only those before it: `rgpo_trl` < `hh_common` <
`tiny_hh` < `hh_rlhf` < the entry script (tests/test_import_graph.py checks it)."""
