"""Per-case metrics: one confusion table per case, every region derived from it.

Each case is read once (reference and every method's prediction). A single ``np.bincount`` over
``reference * n + prediction`` gives the full label-by-label confusion table; the voxel counts of
any region (a union of labels) are sums over its rows and columns, so adding regions costs
nothing. HD95 needs the masks themselves and is computed from the arrays in the same pass.

Scoring conventions (all scores in percent except HD95, which is in mm):

- Dice = 200 * TP / (|ref| + |pred|). A region empty in both reference and prediction has no
  Dice; ``empty="one"`` scores it 100 (BraTS convention), ``empty="nan"`` leaves it out (NaN,
  nnU-Net's convention).
- Volume similarity VS = 100 * (1 - ||pred| - |ref|| / (|pred| + |ref|)); both empty as for Dice.
- HD95 = max of the two directed 95th percentiles of surface-to-surface distances (MONAI's
  definition), in mm using the voxel spacing. Both sides empty: 0 mm (``empty="one"``) or NaN
  (``empty="nan"``). Exactly one side empty: the worst value, the length of the image diagonal
  in mm.

>>> ref = np.array([[0, 1, 1], [2, 2, 0]]); pred = np.array([[0, 1, 0], [2, 2, 2]])
>>> labels, table = confusion_table(ref, pred)
>>> labels.tolist(), table.tolist()
([0, 1, 2], [[1, 0, 1], [1, 1, 0], [0, 0, 2]])
>>> counts = region_counts(labels, table, (1, 2))
>>> counts
(4, 4, 3)
>>> dice_percent(*counts, empty="one")
75.0
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from nnunet_dro.evaluation.io import Geometry, check_same_geometry, read_segmentation

METRICS = ("dice", "hd95", "vs")
EMPTY_POLICIES = ("one", "nan")


def confusion_table(reference: np.ndarray, prediction: np.ndarray,
                    ignore_label: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Voxel counts per (reference label, prediction label) pair, for the labels present.

    Returns ``(labels, table)`` with ``table[i, j]`` = number of voxels labelled ``labels[i]`` in
    the reference and ``labels[j]`` in the prediction. Reference voxels with ``ignore_label`` are
    left out (as nnU-Net does).
    """
    ref = reference.ravel()
    pred = prediction.ravel()
    n = int(max(ref.max(initial=0), pred.max(initial=0))) + 1
    if n * n <= 256 and ref.dtype == np.uint8 and pred.dtype == np.uint8:
        index = ref * np.uint8(n) + pred  # fits in uint8: no widening copy before bincount
    elif n <= 4096:
        index = ref.astype(np.int64) * n + pred
    else:  # sparse, large label values: compact them first
        values, inverse = np.unique(np.concatenate([ref, pred]), return_inverse=True)
        n = len(values)
        index = inverse[: ref.size].astype(np.int64) * n + inverse[ref.size:]
        table = np.bincount(index, minlength=n * n).reshape(n, n)
        if ignore_label is not None and ignore_label in values:
            table[np.searchsorted(values, ignore_label)] = 0
        return _compact(values, table)
    table = np.bincount(index, minlength=n * n).reshape(n, n)
    if ignore_label is not None and ignore_label < n:
        table[ignore_label] = 0
    return _compact(np.arange(n), table)


def _compact(values: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    present = (table.sum(axis=0) + table.sum(axis=1)) > 0
    return values[present].astype(np.int64), table[np.ix_(present, present)].astype(np.int64)


def region_counts(labels: np.ndarray, table: np.ndarray, region: tuple[int, ...]) -> tuple[int, int, int]:
    """``(n_ref, n_pred, tp)`` voxel counts of a region (a union of labels) from a confusion table."""
    inside = np.isin(labels, region)
    if not inside.any():
        return 0, 0, 0
    return int(table[inside].sum()), int(table[:, inside].sum()), int(table[np.ix_(inside, inside)].sum())


def dice_percent(n_ref: int, n_pred: int, tp: int, empty: str = "one") -> float:
    """Dice in percent; both empty -> 100 (``empty="one"``) or NaN (``empty="nan"``)."""
    if n_ref + n_pred == 0:
        return 100.0 if empty == "one" else float("nan")
    return 200.0 * tp / (n_ref + n_pred)


def volume_similarity_percent(n_ref: int, n_pred: int, empty: str = "one") -> float:
    """Volume similarity in percent; both empty -> 100 (``empty="one"``) or NaN (``empty="nan"``)."""
    if n_ref + n_pred == 0:
        return 100.0 if empty == "one" else float("nan")
    return 100.0 * (1.0 - abs(n_pred - n_ref) / (n_pred + n_ref))


def hd95_empty_value(n_ref: int, n_pred: int, geometry: Geometry, empty: str = "one") -> float | None:
    """HD95 when a side is empty: both -> 0 or NaN (policy), one -> the image diagonal in mm.

    ``None`` when both sides have voxels (compute it with :func:`hd95_mm`).
    """
    if n_ref == 0 and n_pred == 0:
        return 0.0 if empty == "one" else float("nan")
    if n_ref == 0 or n_pred == 0:
        return geometry.diagonal_mm
    return None


def _surface(mask: np.ndarray) -> np.ndarray:
    # Voxels of the mask with a face-neighbour outside it (outside the image counts as outside).
    structure = ndimage.generate_binary_structure(mask.ndim, 1)
    return mask & ~ndimage.binary_erosion(mask, structure=structure, border_value=0)


def hd95_mm(reference_mask: np.ndarray, prediction_mask: np.ndarray, spacing) -> float:
    """Symmetric 95th-percentile Hausdorff distance in mm between two non-empty masks.

    Computed on the bounding box of both masks (plus one voxel), which is exact: every surface
    voxel lies inside it, and Euclidean distance transforms are exact on any sub-grid that holds
    them.

    >>> a = np.zeros((1, 1, 5), bool); a[0, 0, 0] = True
    >>> b = np.zeros((1, 1, 5), bool); b[0, 0, 3] = True
    >>> hd95_mm(a, b, (1.0, 1.0, 2.0))
    6.0
    """
    union = reference_mask | prediction_mask
    box = []
    for axis in range(union.ndim):
        other_axes = tuple(a for a in range(union.ndim) if a != axis)
        hits = np.flatnonzero(union.any(axis=other_axes))
        box.append(slice(max(int(hits[0]) - 1, 0), int(hits[-1]) + 2))
    box = tuple(box)
    ref_surface = _surface(reference_mask[box])
    pred_surface = _surface(prediction_mask[box])
    spacing = tuple(float(s) for s in spacing)
    to_pred = ndimage.distance_transform_edt(~pred_surface, sampling=spacing)[ref_surface]
    to_ref = ndimage.distance_transform_edt(~ref_surface, sampling=spacing)[pred_surface]
    return float(max(np.percentile(to_pred, 95), np.percentile(to_ref, 95)))


@dataclass
class MethodCaseResult:
    """One method's result on one case: confusion table and HD95 per region (NaN if a side is empty)."""

    labels: np.ndarray
    table: np.ndarray
    hd95: dict[tuple[int, ...], float] = field(default_factory=dict)


@dataclass
class CaseResult:
    case: str
    geometry: Geometry
    methods: dict[str, MethodCaseResult]
    reference_labels: tuple[int, ...]  # label values present in the reference (ignore label excluded)


@dataclass(frozen=True)
class CaseTask:
    """Work for one case: the reference and every method's prediction file (read once each).

    ``hd95_regions`` ``None`` means "every foreground label present" (default regions).
    """

    case: str
    reference: str
    predictions: tuple[tuple[str, str], ...]
    ignore_label: int | None = None
    compute_hd95: bool = False
    hd95_regions: tuple[tuple[int, ...], ...] | None = None


def evaluate_case(task: CaseTask) -> CaseResult:
    """Read one case's files and compute its confusion tables (and HD95). Runs in worker processes."""
    reference, geometry = read_segmentation(task.reference)
    results = {}
    for method, path in task.predictions:
        prediction, pred_geometry = read_segmentation(path)
        check_same_geometry(task.case, geometry, pred_geometry, method)
        labels, table = confusion_table(reference, prediction, task.ignore_label)
        result = MethodCaseResult(labels, table)
        if task.compute_hd95:
            regions = task.hd95_regions
            if regions is None:
                regions = tuple((int(v),) for v in labels if v != 0)
            for region in regions:
                result.hd95[region] = _hd95_of_region(reference, prediction, region, geometry, task.ignore_label)
        results[method] = result
    if results:
        first = next(iter(results.values()))
        reference_labels = tuple(int(v) for v, n in zip(first.labels, first.table.sum(axis=1)) if n > 0)
    else:  # every prediction of this case is missing: still needed for default regions and label checks
        reference_labels = tuple(int(v) for v in np.flatnonzero(np.bincount(reference.ravel()))
                                 if v != task.ignore_label)
    return CaseResult(task.case, geometry, results, reference_labels)


def _hd95_of_region(reference, prediction, region, geometry, ignore_label) -> float:
    ref_mask = np.isin(reference, region)
    pred_mask = np.isin(prediction, region)
    if ignore_label is not None:
        pred_mask &= reference != ignore_label
    if not ref_mask.any() or not pred_mask.any():
        return float("nan")  # scored by policy in the parent (see hd95_empty_value)
    return hd95_mm(ref_mask, pred_mask, geometry.spacing)
