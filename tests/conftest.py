"""Test-wide settings: no hub access (everything runs on assets built offline)."""

import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# No sys.path edits: pyproject's `pythonpath = ["."]` puts the checkout first (the lab, rgpo_lab, with its
# MuJoCo runner, is not installed), and pytest puts tests/ itself on sys.path, so the test modules import
# their shared helpers (_trainer_utils, _mujoco_utils) by name.

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small models on a shared 2-core box: one intra-op thread, restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """The tiny policy and its tokenizer on disk (rgpo_trl.testing.save_tiny_model, seed 0), built once for
    every trainer test module that does not build its own."""
    from rgpo_trl.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="session")
def quick_assets(tmp_path_factory):
    """The small tiny-HH assets, built once per machine into the cache like the demo's
    (``RGPO_TRL_TEST_FRESH_BUILD=1``: into a temporary directory instead)."""
    from recipes.tiny_hh import build_tiny_assets

    cache = tmp_path_factory.mktemp("rgpo_cache") if os.environ.get("RGPO_TRL_TEST_FRESH_BUILD") else None
    return build_tiny_assets(cache, quick=True, num_threads=1, verbose=False)


def assets_cache_root(assets):
    """The cache root to pass back to ``build_tiny_assets``: ``<root>/tiny_hh/v<N>-quick`` -> ``<root>``."""
    return assets.root.parent.parent


_RESULTS_DATA_STATUS: dict = {}  # suites -> rgpo_lab.results_data.status of them


def pytest_runtest_setup(item):
    """``@pytest.mark.results_data("rlhf/v3", ...)``: the test reads those suites' per-step logs, which are
    not tracked. Skipped (with the command) while they are not restored; failed when one on disk has another
    checksum than the manifest records, since the test would then read other data than the report did."""
    marker = item.get_closest_marker("results_data")
    if marker is None:
        return
    from rgpo_lab.results_data import status

    if marker.args not in _RESULTS_DATA_STATUS:  # hashed once a session, not once a test
        _RESULTS_DATA_STATUS[marker.args] = status(suites=marker.args)
    for suite, st in _RESULTS_DATA_STATUS[marker.args].items():
        if st.different:
            pytest.fail(f"results/{st.different[0]} differs from results/per_step_data.json ({suite})")
        if st.missing:
            pytest.skip(
                f"per-step logs of {suite} not restored ({st.missing} missing): run `make results-data`"
            )
