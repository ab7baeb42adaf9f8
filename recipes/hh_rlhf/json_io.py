"""The recipe's JSON files (metrics.jsonl, summary.json, heldout.json, validation.json(l)) are valid JSON:
Python's ``json`` writes a non-finite float as ``NaN`` or ``Infinity``, which no strict reader (``jq``,
JavaScript, most languages' JSON libraries) accepts. A mean over no values (a metric no iteration of the
window logged) is such a float; it is written as ``null``, which the documentation gives its meaning."""

from __future__ import annotations

import json
import math
from typing import IO, Any


def finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +-inf; numpy's float64 too) replaced by None, inside dicts,
    lists and tuples as well."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of `finite_or_null` (``value``), refusing anything else that is not valid JSON."""
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)


def dump(value: Any, f: IO[str], **kwargs: Any) -> None:
    """``json.dump`` of `finite_or_null` (``value``), refusing anything else that is not valid JSON."""
    json.dump(finite_or_null(value), f, allow_nan=False, **kwargs)
