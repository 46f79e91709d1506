"""argparse types for numeric options: a bad number is a one-line usage error with exit code 2.

>>> positive_int("4"), non_negative_int("0"), percentile("2.5")
(4, 0, 2.5)
>>> positive_int("-3")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: -3 is not a positive integer
"""
from __future__ import annotations

import argparse
import math


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not {what}") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (processes, epochs, iterations)."""
    value = _integer(text, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, counts that may be zero)."""
    value = _integer(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not an integer >= 0")
    return value


def count_or_share(text: str) -> int | float:
    """A number of cases (an integer >= 1) or a share of them: ``5%`` or a decimal in (0, 1).

    >>> count_or_share("10"), count_or_share("5%"), count_or_share("0.05")
    (10, 0.05, 0.05)
    """
    value = text.strip()
    try:
        if value.endswith("%"):
            share = float(value[:-1]) / 100.0
        elif value.isdigit():
            count = int(value)
            if count < 1:
                raise ValueError
            return count
        else:
            share = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is neither a count of cases (>= 1) nor a share (5% or 0.05)") from None
    if not (math.isfinite(share) and 0.0 < share < 1.0):
        raise argparse.ArgumentTypeError(f"{text}: a share must lie strictly between 0 and 100 % (or 0 and 1)")
    return share


def dataset_id(text: str) -> int:
    """nnU-Net's dataset IDs: 1..999."""
    value = _integer(text, "a dataset ID (1-999)")
    if not 1 <= value <= 999:
        raise argparse.ArgumentTypeError(f"{text} is not a dataset ID (1-999)")
    return value


def dataset_id_or_name(text: str) -> int:
    """nnU-Net's ``-d``: a dataset ID or its folder name (``201``, ``Dataset201_FeTA``) -> the ID.

    >>> dataset_id_or_name("Dataset201_FeTA"), dataset_id_or_name("7")
    (201, 7)
    """
    import re

    match = re.fullmatch(r"Dataset(\d{3})_.+", text.strip())
    return int(match.group(1)) if match else dataset_id(text)


def _finite(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not {what}")
    return value


def percentile(text: str) -> float:
    """A percentile, 0..100."""
    value = _finite(text, "a number between 0 and 100")
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 100")
    return value


def fraction(text: str) -> float:
    """A fraction in [0, 1)."""
    value = _finite(text, "a fraction in [0, 1)")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in [0, 1)")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _finite(text, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value
