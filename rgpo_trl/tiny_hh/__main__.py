"""CLI: ``python -m rgpo_trl.tiny_hh [--force] [--quick] [--cache-dir DIR] [--seed N]``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from .build import CACHE_ENV, DEFAULT_SEED, build_tiny_assets


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Build (if missing) the offline tiny-HH assets and print their paths."
    )
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--quick", action="store_true", help="the small variant used by the tests")
    p.add_argument(
        "--cache-dir", default=None, help=f"cache root (default ${CACHE_ENV} or ~/.cache/rgpo_trl)"
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--threads", type=int, default=1, help="torch threads during the build")
    a = p.parse_args(argv)
    assets = build_tiny_assets(a.cache_dir, force=a.force, quick=a.quick, seed=a.seed, num_threads=a.threads)
    print(
        json.dumps(
            {
                "root": str(assets.root),
                "train_file": str(assets.train_file),
                "test_file": str(assets.test_file),
                "policy_dir": str(assets.policy_dir),
                "reward_model_dir": str(assets.reward_model_dir),
                "build_info": assets.build_info,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
