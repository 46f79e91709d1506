"""``EvaluationOptions``: every option of :func:`~nnunet_dro.evaluation.api.evaluate` as one typed object.

The same bundle (groups, regions, metrics, policies, processes, ...) goes from the CLI to
``evaluate``, from ``nnunet_dro ensemble`` to :func:`~nnunet_dro.evaluation.api.check_inputs`
and ``evaluate``, and from :func:`~nnunet_dro.evaluation.multirun.evaluate_runs` to ``evaluate``;
carrying it as one frozen object means each option is spelled, defaulted and checked once,
here, instead of in every signature that forwards it.

The checks that need no file run when the object is made, so a bad value fails before any folder
is listed. The sequences are kept as tuples (the object is immutable), metric aliases are
expanded (``topology`` -> euler, b0, b1, b2) and repeated metrics or percentiles dropped.

>>> from nnunet_dro.evaluation import EvaluationOptions
>>> options = EvaluationOptions(metrics=["dice", "topology"], percentiles=[10, 5, 10], missing="worst")
>>> options.metrics, options.percentiles
(('dice', 'euler', 'b0', 'b1', 'b2'), (10.0, 5.0))
>>> options.with_overrides(empty="nan").empty, options.empty
('nan', 'one')
>>> EvaluationOptions(percentiles=[120])
Traceback (most recent call last):
...
nnunet_dro.evaluation.options.EvaluationOptionError: --percentiles: 120 is not between 0 and 100
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.metrics import EMPTY_POLICIES, METRIC_ALIASES, METRICS
from nnunet_dro.evaluation.regions import RegionSpec

MISSING_POLICIES = ("error", "worst", "skip")


class EvaluationOptionError(ValueError, UserError):
    """An option value that no input can make right (an unknown metric, a percentile above 100).

    A ``ValueError`` for library callers, a ``UserError`` for the CLI (one-line message, exit code 2).
    """


@dataclass(frozen=True)
class EvaluationOptions:
    """How :func:`~nnunet_dro.evaluation.api.evaluate` scores and stratifies (everything but the folders).

    ``groups``: subgroup table (.csv/.tsv); ``group_by``: its columns to stratify by (``COL:EDGES``
    bins a numeric one); ``case_column``: its column of case identifiers; ``groups_partial``: cases
    without a row form the group '(not in table)'. ``regions``: preset, dataset.json, inline spec or
    :class:`~nnunet_dro.evaluation.regions.RegionSpec` (None: the dataset.json beside the references).
    ``metrics``, ``percentiles``: what is scored and which tails are reported. ``empty``: "one" or
    "nan" for a region empty in both masks; ``missing``: "error", "worst" or "skip" for a case
    without prediction. ``num_processes``: reading processes (None: ``nnUNet_def_n_proc`` or 8);
    ``n_bootstrap``: bootstrap resamples (0: none); ``strict``: a region or preset that fits no
    reference is an error, not a warning; ``progress``: a progress bar on stderr; ``folds``: the
    folds of a trainer-folder prediction (None: all); ``nsd_tolerance``: NSD tolerance in mm (None:
    by preset); ``echo``: where warnings and notes go (None: stderr for ``evaluate``).

    >>> EvaluationOptions(num_processes=0)
    Traceback (most recent call last):
    ...
    nnunet_dro.evaluation.options.EvaluationOptionError: -np 0: need at least 1 process
    """

    groups: str | None = None
    group_by: tuple[str, ...] | None = None
    case_column: str = "case"
    groups_partial: bool = False
    regions: str | RegionSpec | None = None
    metrics: tuple[str, ...] = ("dice",)
    percentiles: tuple[float, ...] = (25.0, 10.0, 5.0)
    empty: str = "one"
    missing: str = "error"
    num_processes: int | None = None
    n_bootstrap: int = 0
    strict: bool = True
    progress: bool = True
    folds: tuple[int, ...] | None = None
    nsd_tolerance: float | None = None
    echo: Callable[[str], None] | None = None
    gallery: int = 4  # worst cases per group and region in worst_<metric>.png (0: none); evaluation/gallery.py
    images: str | None = None  # the gallery's images (None: the imagesXx beside the references' labelsXx)

    def __post_init__(self) -> None:
        # frozen: the normalised values are set through object.__setattr__, once, here
        set_ = object.__setattr__
        set_(self, "metrics", _checked_metrics(self.metrics))
        set_(self, "percentiles", _checked_percentiles(self.percentiles))
        if self.group_by is not None:
            set_(self, "group_by", tuple(self.group_by))
        if self.folds is not None:
            set_(self, "folds", tuple(self.folds))
        if self.empty not in EMPTY_POLICIES:
            raise EvaluationOptionError(f"--empty {self.empty!r}: choose one of {', '.join(EMPTY_POLICIES)}")
        if self.missing not in MISSING_POLICIES:
            raise EvaluationOptionError(f"--missing {self.missing!r}: choose one of {', '.join(MISSING_POLICIES)}")
        if self.num_processes is not None and self.num_processes < 1:
            raise EvaluationOptionError(f"-np {self.num_processes}: need at least 1 process")
        if self.n_bootstrap < 0:
            raise EvaluationOptionError(f"--bootstrap {self.n_bootstrap}: must be 0 (off) or a positive number of "
                                        f"resamples")
        if self.gallery < 0:
            raise EvaluationOptionError(f"--gallery {self.gallery}: give a number of cases, 0 (no gallery) or more")
        if self.group_by and not self.groups:
            raise EvaluationOptionError("--group-by needs a group table (-groups TABLE.csv|.tsv)")
        tolerance = self.nsd_tolerance
        if tolerance is not None and (not np.isfinite(tolerance) or tolerance < 0):
            raise EvaluationOptionError(f"--nsd-tolerance {tolerance:g}: give a distance in mm, 0 or more")

    def with_overrides(self, **overrides: Any) -> EvaluationOptions:
        """A copy with ``overrides`` replaced (and checked again); an unknown name is a TypeError."""
        _check_names(overrides, "with_overrides")
        return dataclasses.replace(self, **overrides)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(EvaluationOptions))


def resolve_options(options: EvaluationOptions | None, overrides: Mapping[str, Any],
                    function: str) -> EvaluationOptions:
    """``options`` (None: the defaults) with the keyword ``overrides`` of ``function`` applied.

    This is how ``evaluate(..., metrics=["hd95"])`` keeps working beside ``evaluate(..., options=o)``.

    >>> resolve_options(None, {"empty": "nan"}, "evaluate").empty
    'nan'
    >>> resolve_options(None, {"metric": ["dice"]}, "evaluate")
    Traceback (most recent call last):
    ...
    TypeError: evaluate() got an unexpected keyword argument 'metric'
    """
    if options is not None and not isinstance(options, EvaluationOptions):
        raise TypeError(f"{function}(): options must be an EvaluationOptions, not {type(options).__name__}")
    _check_names(overrides, function)
    base = options if options is not None else EvaluationOptions()
    return dataclasses.replace(base, **overrides) if overrides else base


def _check_names(overrides: Mapping[str, Any], function: str) -> None:
    unknown = [name for name in overrides if name not in FIELD_NAMES]
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")


def _checked_metrics(metrics: Sequence[str]) -> tuple[str, ...]:
    if isinstance(metrics, str):
        metrics = (metrics,)  # one name, not its letters
    expanded = [name for m in metrics for name in METRIC_ALIASES.get(m.lower(), (m.lower(),))]
    unique = tuple(dict.fromkeys(expanded))
    unknown = [m for m in unique if m not in METRICS]
    if unknown or not unique:
        raise EvaluationOptionError(f"unknown metric {unknown[0] if unknown else ''!r} (choose from "
                                    f"{', '.join(METRICS + tuple(METRIC_ALIASES))})")
    return unique


def _checked_percentiles(percentiles: Sequence[float]) -> tuple[float, ...]:
    values = [float(q) for q in percentiles]
    for q in values:
        if not np.isfinite(q) or not 0 <= q <= 100:
            raise EvaluationOptionError(f"--percentiles: {q:g} is not between 0 and 100")
    return tuple(dict.fromkeys(values))
