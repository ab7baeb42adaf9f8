"""Plain JSON values for the lab's report files: numpy scalars as Python ones, non-finite floats as null (the
files are written with allow_nan=False, so a strict reader accepts them)."""

from __future__ import annotations

from typing import Any

import numpy as np


def plain(x: Any, named_as_dicts: bool = False) -> Any:
    """``x`` with dict keys as strings, tuples as lists, numpy scalars as Python ones, NaN / inf as None;
    NamedTuples (MeanStd, Welch) as lists like any tuple, or with ``named_as_dicts`` as dicts of their
    fields (the format the MuJoCo report has always written)."""
    if named_as_dicts and hasattr(x, "_asdict"):
        return plain(x._asdict(), named_as_dicts)
    if isinstance(x, dict):
        return {str(k): plain(v, named_as_dicts) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v, named_as_dicts) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x
