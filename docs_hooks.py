"""MkDocs hook: publish the committed results and benchmark outputs with the site, so the pages link to the
exact files a command wrote (tables, figures, JSON) and `mkdocs build --strict` fails when one is missing."""

from __future__ import annotations

import glob
import os

from mkdocs.structure.files import File

# repository files that pages link to, relative to the repository root
PUBLISHED = [
    "results/benchmarks/**/*",
    "results/mujoco/report/**/*",
    "results/rlhf/report/**/*",
    "results/rlhf/*/report/**/*",
    "results/rlhf/v3/*/report/**/*",
    "results/rlhf/tune/selection.*",
    "results/rlhf/v3/tune/selection.*",
]


def on_files(files, config):
    root = os.path.dirname(config["docs_dir"])
    for pattern in PUBLISHED:
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            if os.path.isfile(path):
                rel = os.path.relpath(path, root)
                site = {"dest_dir": config["site_dir"], "use_directory_urls": config["use_directory_urls"]}
                files.append(File(rel, src_dir=root, **site))
    return files
