"""Plain JSON values for the lab's new report files: numpy scalars as Python ones, non-finite floats as null
(the files are written with allow_nan=False, so a strict reader accepts them)."""

from __future__ import annotations

from typing import Any

import numpy as np


def plain(x: Any) -> Any:
    """``x`` with dict keys as strings, tuples as lists, numpy scalars as Python ones, NaN / inf as None."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x
