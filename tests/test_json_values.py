"""The lab's report files are strict JSON: non-finite numbers become null (a strict reader, e.g.
json.loads(..., parse_constant=...) raising on NaN, accepts them), numpy scalars plain numbers, and
NamedTuples keep the shape each report has always written."""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import numpy as np
import pytest

from rgpo_lab.json_values import plain


class Pair(NamedTuple):
    mean: float
    n: int


def _strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_values_become_null_at_any_depth():
    value = {"a": [1.0, float("nan"), {"b": (np.float64("inf"), -math.inf)}], 3: np.int64(7)}
    text = json.dumps(plain(value), allow_nan=False)
    assert _strict_loads(text) == {"a": [1.0, None, {"b": [None, None]}], "3": 7}
    with pytest.raises(ValueError):
        _strict_loads(json.dumps(value, default=int))  # what json writes by itself: NaN, Infinity


def test_named_tuples_as_lists_or_as_dicts():
    x = Pair(np.float64(0.5), np.int64(3))
    assert plain(x) == [0.5, 3] and plain(x, named_as_dicts=True) == {"mean": 0.5, "n": 3}
    nested = {"k": [Pair(float("nan"), 2)]}
    assert plain(nested, named_as_dicts=True) == {"k": [{"mean": None, "n": 2}]}
    assert type(plain(np.float32(0.25))) is float and type(plain(np.bool_(True))) is bool
