"""Fail-fast checks before loading a model or dataset from the Hugging Face Hub.

The machines this project runs on usually have no hub access. ``from_pretrained`` /
``load_dataset`` on a hub id then either fails deep inside a training launch or waits
on network timeouts. :func:`ensure_loadable` answers *before* any training starts:

* a local path (directory or file) is returned as is;
* something that looks like a path but does not exist raises :class:`FileNotFoundError`;
* a hub id is accepted if it is already in the local hub cache (a snapshot for models;
  a snapshot, or the ``datasets`` cache, for datasets);
* otherwise, when the hub is offline (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE`` for
  models, ``HF_DATASETS_OFFLINE`` for datasets) or a short network probe fails,
  :class:`HubUnavailableError` is raised, naming the id and telling the user to pass a
  local path or use ``--config recipes/configs/hh_rlhf_tiny.yaml`` (the embedded offline assets, see
  :mod:`recipes.tiny_hh`).

The probe timeout defaults to 5 s and can be set with ``RGPO_TRL_HUB_PROBE_TIMEOUT``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

Kind = Literal["model", "dataset"]

_TRUE = {"1", "true", "yes", "on"}
DEFAULT_PROBE_TIMEOUT_S = 5.0


class HubUnavailableError(RuntimeError):
    """A hub id was requested but the hub cannot be reached and the id is not cached."""


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def hub_offline(kind: Kind = "model") -> bool:
    """True when the environment says the hub must not be contacted."""
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    except Exception:  # pragma: no cover - huggingface_hub is a hard dependency of transformers
        pass
    names = ["HF_HUB_OFFLINE"] + (["TRANSFORMERS_OFFLINE"] if kind == "model" else ["HF_DATASETS_OFFLINE"])
    return any(_env_true(n) for n in names)


def looks_like_local_path(name_or_path: str) -> bool:
    """Heuristic: hub ids are ``name`` or ``owner/name``; paths have other shapes."""
    s = str(name_or_path)
    if s.startswith(("/", "./", "../", "~", ".\\")) or s in (".", ".."):
        return True
    if "\\" in s or s.count("/") > 1:
        return True
    return s.endswith((".json", ".jsonl", ".jsonl.gz", ".json.gz", ".parquet", ".csv", ".arrow"))


def _is_cached(repo_id: str, kind: Kind) -> bool:
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id, repo_type=kind, local_files_only=True)
        return True
    except Exception:
        pass
    if kind == "dataset":
        # `datasets` keeps processed copies in its own cache (HF_DATASETS_CACHE), named owner___name.
        try:
            from datasets import config as ds_config

            root = Path(ds_config.HF_DATASETS_CACHE)
            if (root / repo_id.replace("/", "___")).is_dir():
                return True
        except Exception:
            pass
    return False


def _probe(repo_id: str, kind: Kind, timeout: float) -> str | None:
    """Cheap metadata request. Returns None if the repo answered, else a reason string."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        try:
            HfApi().repo_info(repo_id, repo_type=kind, timeout=timeout)
            return None
        except GatedRepoError:
            return None  # exists; access/token problems are reported by the real download
        except RepositoryNotFoundError:
            return "not-found"
    except Exception as exc:  # connection errors, timeouts, DNS failures, ...
        return f"network: {type(exc).__name__}: {exc}"


def _message(name: str, kind: Kind, why: str) -> str:
    what = (
        "a directory saved with save_pretrained"
        if kind == "model"
        else "a dataset directory or a .jsonl file"
    )
    return (
        f"Cannot load {kind} {name!r} from the Hugging Face Hub: {why}. Pass a local path instead ({what}), "
        "or use `--config recipes/configs/hh_rlhf_tiny.yaml` to run on the embedded offline tiny-HH assets "
        "(built by `python -m recipes.tiny_hh`)."
    )


def ensure_loadable(
    name_or_path: str | os.PathLike, kind: Kind = "model", *, probe_timeout: float | None = None
) -> str:
    """Check that ``name_or_path`` can be loaded without waiting on an unreachable hub.

    Returns ``name_or_path`` as a string (expanded if it is a local path). Raises
    :class:`HubUnavailableError` (offline / unreachable hub and not cached) or
    :class:`FileNotFoundError` (a path that does not exist) otherwise.
    """
    if kind not in ("model", "dataset"):
        raise ValueError(f"kind must be 'model' or 'dataset', got {kind!r}")
    name = os.fspath(name_or_path)
    expanded = os.path.expanduser(name)
    if os.path.exists(expanded):
        return expanded
    if looks_like_local_path(name):
        raise FileNotFoundError(f"Local {kind} path {name!r} does not exist.")
    if _is_cached(name, kind):
        return name
    if hub_offline(kind):
        raise HubUnavailableError(
            _message(name, kind, "the hub is offline (HF_HUB_OFFLINE=1) and it is not cached")
        )
    if probe_timeout is None:
        probe_timeout = float(os.environ.get("RGPO_TRL_HUB_PROBE_TIMEOUT", DEFAULT_PROBE_TIMEOUT_S))
    reason = _probe(name, kind, probe_timeout)
    if reason is None:
        return name
    if reason == "not-found":
        raise HubUnavailableError(_message(name, kind, "no such repository on the hub (or it is private)"))
    raise HubUnavailableError(_message(name, kind, f"the hub is unreachable ({reason}) and it is not cached"))
