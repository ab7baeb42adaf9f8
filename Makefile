# The README's two commands: `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# A CPU wheel of torch for machines without one; GPU users keep the torch they installed.
TORCH_CPU ?= torch==2.13.0
EXTRAS ?= all
# The versions CI passed with (pip's -c); `CONSTRAINTS= make install` resolves the newest releases instead.
# An installed checkout (.install.stamp) keeps its versions until `make clean install`.
CONSTRAINTS ?= constraints.txt
STAMP := .install.stamp

.PHONY: install demo core-demo test test-slow lint docs clean results-data

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import torch" 2>/dev/null || { echo "[install] torch CPU wheel ($(TORCH_CPU)), about a minute"; \
		$(PIP) install --quiet "$(TORCH_CPU)"; }
	@echo "[install] rgpo-trl and its extras [$(EXTRAS)] (TRL, transformers, MuJoCo, DeepSpeed, ...), 1-2 minutes"
	$(PIP) install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[$(EXTRAS)]"
	@echo "[install] done"
	@touch $(STAMP)

install: $(STAMP)

# The main job on the embedded default: build the tiny offline assets (cached in $$RGPO_TRL_CACHE or
# ~/.cache/rgpo_trl) if missing, then the HH-RLHF recipe with the tiny preset: one CPU process, so no launcher
# (the recipe's one-line errors and exit status reach the user as they are), one torch thread (the preset's
# cpu_threads; results/benchmarks/demo_timing.md).
demo: $(STAMP)
	$(PYTHON) -m recipes.tiny_hh
	$(PYTHON) recipes/hh_rlhf_qwen.py --config recipes/configs/hh_rlhf_tiny.yaml $(DEMO_ARGS)

core-demo: $(STAMP)
	$(PYTHON) examples/core_demo.py

test: $(STAMP)
	$(PYTHON) -m pytest

test-slow: $(STAMP)
	$(PYTHON) -m pytest -m slow

# The per-step logs (results/**/metrics.csv) are not tracked: write them back from main's history, offline,
# each checked against its SHA-256 (results/per_step_data.json; standard library only, no install needed).
results-data:
	$(PYTHON) -m rgpo_lab.results_data restore

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or reference fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

clean:
	rm -f $(STAMP)
