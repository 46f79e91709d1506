"""Held-out test selection shared by the converters: explicit case lists or a stratified fraction."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from nnunet_dro.errors import UserError


def parse_case_list(values: Sequence[str] | None) -> list[str]:
    """Case identifiers from command-line values: ``a,b`` and ``@file`` (one per line) both work.

    >>> parse_case_list(["sub-001,sub-002", "sub-007"])
    ['sub-001', 'sub-002', 'sub-007']
    """
    cases: list[str] = []
    for value in values or ():
        if value.startswith("@"):
            path = Path(value[1:])
            if not path.is_file():
                raise UserError(f"{path}: case list file not found")
            cases += [line.strip() for line in path.read_text().splitlines()
                      if line.strip() and not line.startswith("#")]
        else:
            cases += [part.strip() for part in value.split(",") if part.strip()]
    return cases


def choose_test_cases(cases: Sequence[str], strata: Sequence[str], fraction: float = 0.0,
                      explicit: Sequence[str] = (), seed: int = 0) -> set[str]:
    """The cases to hold out: ``explicit`` ones, or ``fraction`` of each stratum (seeded).

    Stratifying by the subgroup (e.g. condition or grade) keeps rare groups in both splits: every
    stratum with at least two cases gives at least one test case and keeps at least one for
    training.

    >>> sorted(choose_test_cases(["a", "b", "c", "d"], ["x", "x", "y", "y"], 0.5, seed=1))
    ['a', 'd']
    """
    if explicit and fraction:
        raise UserError("give either test cases or a test fraction, not both")
    known = set(cases)
    if explicit:
        unknown = sorted(set(explicit) - known)
        if unknown:
            raise UserError(f"unknown test cases {unknown[:5]} (not found in the input)")
        return set(explicit)
    if not 0.0 <= fraction < 1.0:
        raise UserError(f"test fraction {fraction} must be in [0, 1)")
    if fraction == 0.0:
        return set()
    rng = np.random.default_rng(seed)
    chosen: set[str] = set()
    by_stratum: dict[str, list[str]] = {}
    for case, stratum in zip(cases, strata):
        by_stratum.setdefault(str(stratum), []).append(case)
    for stratum in sorted(by_stratum):
        members = sorted(by_stratum[stratum])
        count = int(round(fraction * len(members)))
        if len(members) >= 2:
            count = min(max(count, 1), len(members) - 1)
        chosen.update(rng.choice(members, size=count, replace=False).tolist() if count else [])
    return chosen



@dataclass(frozen=True)
class HeldOutSplit:
    """Which cases a converter holds out in imagesTs/labelsTs: the ``test_cases`` named, or a
    ``test_fraction`` of each stratum drawn with ``seed`` (``--test-cases``, ``--test-fraction``,
    ``--seed``); the default holds out none. Giving both, a fraction outside [0, 1) or a negative
    seed is a one-line UserError; whether the named cases exist is checked against the input
    (:meth:`choose`).

    >>> HeldOutSplit(["a"]).choose(["a", "b"], ["x", "x"])
    {'a'}
    >>> HeldOutSplit(["a"], test_fraction=0.5)
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: give either test cases or a test fraction, not both
    """

    test_cases: Sequence[str] = ()
    test_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "test_cases", tuple(self.test_cases))  # frozen: normalised once, here
        if self.test_cases and self.test_fraction:
            raise UserError("give either test cases or a test fraction, not both")
        if not 0.0 <= self.test_fraction < 1.0:
            raise UserError(f"test fraction {self.test_fraction} must be in [0, 1)")
        if int(self.seed) != self.seed or self.seed < 0:
            raise UserError(f"test split seed {self.seed} must be an integer >= 0")

    def choose(self, cases: Sequence[str], strata: Sequence[str]) -> set[str]:
        """The held-out cases among ``cases`` (``strata``: the subgroup of each, for a fraction)."""
        return choose_test_cases(cases, strata, self.test_fraction, self.test_cases, self.seed)
