"""CLI: ``python -m recipes.tiny_hh [--force] [--quick] [--version 2|3] [--cache-dir DIR] [--seed N]
[--manifest]``: one line saying where the assets are (and how long a build took); the JSON manifest (paths,
build info, about 80 lines) only when asked for, so ``make demo`` does not open with it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from rgpo_trl.cli import quiet_cpu_libraries

from . import build


def ready_line(assets: build.TinyAssets, version: int, cached: bool) -> str:
    """The one line a run prints: where the assets are and, after a build, how long it took (build_info)."""
    if cached:
        return f"tiny-HH assets v{version} ready (cached): {assets.root}"
    seconds = assets.build_info.get("build_time_s")
    took = f" in {seconds:.0f} s" if isinstance(seconds, (int, float)) else ""
    return f"tiny-HH assets v{version} built{took}: {assets.root} (--manifest: paths and build info)"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m recipes.tiny_hh",
        description="Build (if missing) the offline tiny-HH assets and say where they are; --manifest for "
        "their paths and build info as JSON.",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--quick", action="store_true", help="the small variant used by the tests")
    p.add_argument(
        "--cache-dir", default=None, help=f"cache root (default ${build.CACHE_ENV} or ~/.cache/rgpo_trl)"
    )
    p.add_argument("--seed", type=int, default=build.DEFAULT_SEED)
    p.add_argument("--threads", type=int, default=1, help="torch threads during the build")
    p.add_argument(
        "--version", type=int, choices=build.VERSIONS, default=build.BUILDER_VERSION, help="world version"
    )
    p.add_argument(
        "--manifest",
        "--verbose",
        action="store_true",
        help="print the manifest (paths, build info) as JSON instead of the one line",
    )
    a = p.parse_args(argv)
    existing = build.TinyAssets.at(
        build.assets_dir(a.cache_dir, quick=a.quick, seed=a.seed, version=a.version)
    )
    cached = not a.force and existing.built(a.version, a.seed)  # as build_tiny_assets decides it
    quiet_cpu_libraries()
    assets = build.build_tiny_assets(
        a.cache_dir, force=a.force, quick=a.quick, seed=a.seed, num_threads=a.threads, version=a.version
    )
    if not a.manifest:
        print(ready_line(assets, a.version, cached))
        return 0
    print(
        json.dumps(
            {
                "root": str(assets.root),
                "train_file": str(assets.train_file),
                "test_file": str(assets.test_file),
                **(
                    {"validation_file": str(assets.validation_file)}
                    if assets.validation_file.exists()
                    else {}
                ),
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
