"""Number and interval formatting and NaN-to-JSON, shared by the report (reports.py) and the
several-runs section (runs.py), so that both write ``n/a`` and ``null`` by the same rule."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd


def is_missing(value) -> bool:
    """Whether ``value`` has no number: ``None``, ``pd.NA`` or a float NaN.

    >>> [is_missing(v) for v in (None, pd.NA, float("nan"), np.float32("nan"), 0.0, 3, "x")]
    [True, True, True, True, False, False, False]
    """
    return value is None or value is pd.NA or (isinstance(value, (float, np.floating)) and math.isnan(value))


def fmt(value, decimals: int, signed: bool = False) -> str:
    """``value`` with ``decimals`` decimals (``+`` in front of positives when ``signed``); ``n/a``
    where it is missing.

    >>> fmt(1.25, 1), fmt(0.5, 2, signed=True), fmt(float("nan"), 1)
    ('1.2', '+0.50', 'n/a')
    """
    if is_missing(value):
        return "n/a"
    return f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"


def interval_text(low, high, show: Callable[[float], str]) -> str:
    """``[low, high]``, each bound written by ``show``; ``n/a`` where there is no interval.

    >>> interval_text(1.0, 2.5, lambda v: f"{v:.1f}"), interval_text(float("nan"), float("nan"), str)
    ('[1.0, 2.5]', 'n/a')
    """
    if is_missing(low):
        return "n/a"
    return f"[{show(low)}, {show(high)}]"


def json_value(value):
    """``value`` as JSON can hold it: ``None`` for NaN and ``pd.NA`` (NaN is not JSON), numpy
    scalars as Python numbers; anything else unchanged.

    >>> json_value(float("nan")), json_value(np.int64(3)), json_value(np.bool_(True)), json_value("a")
    (None, 3, True, 'a')
    """
    if is_missing(value):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def json_default(value):
    """``default=`` of :func:`json.dumps`: numpy scalars (NaN as ``null``); a TypeError otherwise."""
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return json_value(value)
    raise TypeError(type(value))
