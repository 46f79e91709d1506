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
- NSD (normalised surface Dice) at a tolerance of ``tau`` mm, in percent: the surface voxels of
  each mask that lie within ``tau`` of the other mask's surface, over all surface voxels of both
  (:func:`nsd_percent`). Both sides empty: 100 or NaN (policy); exactly one side empty: 0.
- Topology errors: ``euler`` = ``|chi(pred) - chi(ref)|`` (Euler characteristic, FeTA 2024's
  topology metric) and ``b0``/``b1``/``b2`` = ``|b_k(pred) - b_k(ref)|`` (Betti numbers:
  connected components, tunnels, cavities), from :func:`topology` (26-connected foreground,
  6-connected background in 3D). An empty mask has ``chi = b0 = b1 = b2 = 0``, so one empty side
  needs no policy; both sides empty: 0 (``empty="one"``) or NaN (``empty="nan"``).

Each metric knows its direction (:data:`METRIC_INFO`): Dice, VS and NSD are better high, HD95
and the topology errors better low; every "worst tenth" statistic uses it.

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
from itertools import combinations

import numpy as np
from scipy import ndimage

from nnunet_dro.evaluation.io import Geometry, check_same_geometry, read_segmentation

EMPTY_POLICIES = ("one", "nan")


@dataclass(frozen=True)
class MetricInfo:
    """What a report needs to know about a metric: its title, unit, direction and precision."""

    title: str
    unit: str
    higher_is_better: bool
    decimals: int


METRIC_INFO: dict[str, MetricInfo] = {
    "dice": MetricInfo("Dice (%)", "percent (0-100)", True, 1),
    "hd95": MetricInfo("HD95 (mm)", "mm", False, 2),
    "vs": MetricInfo("Volume similarity (%)", "percent (0-100)", True, 1),
    "nsd": MetricInfo("NSD (%)", "percent (0-100)", True, 1),
    "euler": MetricInfo("Euler characteristic error", "|chi(pred) - chi(ref)|", False, 2),
    "b0": MetricInfo("Betti b0 error (components)", "|b0(pred) - b0(ref)|", False, 2),
    "b1": MetricInfo("Betti b1 error (tunnels)", "|b1(pred) - b1(ref)|", False, 2),
    "b2": MetricInfo("Betti b2 error (cavities)", "|b2(pred) - b2(ref)|", False, 2),
}
METRICS = tuple(METRIC_INFO)
TOPOLOGY_METRICS = ("euler", "b0", "b1", "b2")
#: ``--metrics topology`` stands for the four topology errors.
METRIC_ALIASES = {"topology": TOPOLOGY_METRICS}
#: Metrics that need the masks, not only the confusion table (no nnU-Net summary.json input).
MASK_METRICS = ("hd95", "nsd") + TOPOLOGY_METRICS


def higher_is_better(metric: str) -> bool:
    """Direction of a metric.

    >>> higher_is_better("dice"), higher_is_better("hd95"), higher_is_better("euler")
    (True, False, False)
    """
    return METRIC_INFO[metric].higher_is_better


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


def _bounding_box(mask: np.ndarray) -> tuple[slice, ...]:
    """Bounding box of the mask's voxels, one voxel wider on each side (clipped to the image)."""
    box = []
    for axis in range(mask.ndim):
        other_axes = tuple(a for a in range(mask.ndim) if a != axis)
        hits = np.flatnonzero(mask.any(axis=other_axes))
        box.append(slice(max(int(hits[0]) - 1, 0), int(hits[-1]) + 2))
    return tuple(box)


def surface_distances(reference_mask: np.ndarray, prediction_mask: np.ndarray,
                      spacing) -> tuple[np.ndarray, np.ndarray]:
    """Distances in mm from each reference surface voxel to the nearest prediction surface voxel,
    and back (both masks non-empty).

    Nearest neighbours of the surface voxels' centres in mm (a k-d tree): the same Euclidean
    distances a distance transform of the other surface gives at those voxels, at a cost that
    grows with the number of surface voxels instead of the volume of their bounding box.

    Surfaces are taken over the image's real dimensions: axes of length 1 are dropped first. A 2D
    case stored as a one-slice NIfTI (1, y, x) would otherwise have every pixel on the surface
    (each has a z-neighbour outside the image), and its HD95 and NSD would differ from the same
    case as a PNG (and from MONAI's 2D values).
    """
    from scipy.spatial import cKDTree

    real = [axis for axis, n in enumerate(reference_mask.shape) if n > 1] or [reference_mask.ndim - 1]
    if len(real) < reference_mask.ndim:
        shape = tuple(reference_mask.shape[a] for a in real)
        reference_mask, prediction_mask = reference_mask.reshape(shape), prediction_mask.reshape(shape)
        spacing = [spacing[a] for a in real]
    box = _bounding_box(reference_mask | prediction_mask)
    scale = np.asarray([float(s) for s in spacing])
    ref_points = np.argwhere(_surface(reference_mask[box])) * scale
    pred_points = np.argwhere(_surface(prediction_mask[box])) * scale
    to_pred = cKDTree(pred_points).query(ref_points, k=1)[0]
    to_ref = cKDTree(ref_points).query(pred_points, k=1)[0]
    return to_pred, to_ref


def hd95_from_distances(to_pred: np.ndarray, to_ref: np.ndarray) -> float:
    """The larger of the two directed 95th percentiles (numpy's linear interpolation)."""
    return float(max(np.percentile(to_pred, 95), np.percentile(to_ref, 95)))


#: Distances within this much of the tolerance count as within it (float rounding of the EDT).
NSD_ROUNDING_MM = 1e-6


def nsd_from_distances(to_pred: np.ndarray, to_ref: np.ndarray, tolerance_mm: float) -> float:
    """Normalised surface Dice in percent: surface voxels of either mask within ``tolerance_mm``
    of the other mask's surface, over all surface voxels of both."""
    limit = tolerance_mm + NSD_ROUNDING_MM
    within = int(np.count_nonzero(to_pred <= limit)) + int(np.count_nonzero(to_ref <= limit))
    return 100.0 * within / (to_pred.size + to_ref.size)


def hd95_mm(reference_mask: np.ndarray, prediction_mask: np.ndarray, spacing) -> float:
    """Symmetric 95th-percentile Hausdorff distance in mm between two non-empty masks.

    >>> a = np.zeros((1, 1, 5), bool); a[0, 0, 0] = True
    >>> b = np.zeros((1, 1, 5), bool); b[0, 0, 3] = True
    >>> hd95_mm(a, b, (1.0, 1.0, 2.0))
    6.0
    """
    return hd95_from_distances(*surface_distances(reference_mask, prediction_mask, spacing))


def nsd_percent(reference_mask: np.ndarray, prediction_mask: np.ndarray, spacing, tolerance_mm: float) -> float:
    """Normalised surface Dice (percent) of two non-empty masks at ``tolerance_mm``.

    Surfaces are voxels of a mask with a face neighbour outside it (as for HD95); distances are
    Euclidean in mm between voxel centres. A voxel-based approximation of the surfel-area version
    of Nikolov et al. (arXiv:1809.04430): each surface voxel weighs the same.

    >>> a = np.zeros((1, 1, 9), bool); a[0, 0, :4] = True  # a 1 x 1 x 9 image is one-dimensional:
    >>> b = np.zeros((1, 1, 9), bool); b[0, 0, 2:8] = True  # a run's surface is its two ends
    >>> nsd_percent(a, b, (1.0, 1.0, 1.0), 1.0)  # a's end 3 and b's end 2 are within 1 mm, 0 and 7 not
    50.0
    """
    return nsd_from_distances(*surface_distances(reference_mask, prediction_mask, spacing), tolerance_mm)


def euler_characteristic(padded: np.ndarray) -> int:
    """Euler characteristic of the union of the closed unit cubes (squares in 2D) of the
    foreground voxels, which is that of the ``ndim``-connected foreground (26 in 3D) with a
    1-connected background: ``sum over cells of (-1)^dim``. A cell of dimension ``d`` (a vertex,
    edge, face or cube) is shared by the ``2^(ndim - d)`` voxels of a window two wide along the
    other axes, and belongs to the union when any of them is foreground; so each count is a few
    logical ORs of shifted views. ``padded`` must have a background border (every cell inside).
    The same number as scikit-image's ``euler_number(mask, connectivity=ndim)`` (checked in the
    tests), at a fraction of its cost.

    >>> cube = np.pad(np.ones((2, 2, 2), bool), 1)
    >>> euler_characteristic(cube), euler_characteristic(np.pad(np.ones((3, 3), bool), 1))
    (1, 1)
    """
    ndim = padded.ndim
    windows: dict[tuple[int, ...], np.ndarray] = {(): padded}
    chi = 0
    for size in range(ndim + 1):
        for axes in combinations(range(ndim), size):
            if axes not in windows:
                smaller = windows[axes[:-1]]
                axis = axes[-1]
                windows[axes] = (np.take(smaller, range(smaller.shape[axis] - 1), axis=axis)
                                 | np.take(smaller, range(1, smaller.shape[axis]), axis=axis))
            dimension = ndim - size
            chi += (-1) ** dimension * int(np.count_nonzero(windows[axes]))
        # windows of this size are needed only to build the next size
        for axes in [a for a in windows if len(a) < size]:
            del windows[axes]
    return chi


def topology(mask: np.ndarray) -> tuple[int, int, int, int]:
    """``(chi, b0, b1, b2)`` of a binary mask: Euler characteristic and Betti numbers.

    Foreground is ``ndim``-connected (26 neighbours in 3D, 8 in 2D), background 1-connected (6,
    4): the pairing under which ``chi = b0 - b1 + b2`` holds for digital images. ``b0`` counts
    foreground components, ``b2`` cavities (background components that do not reach the image
    border; 0 in 2D), both by connected-component labelling (scipy), ``chi`` comes from
    :func:`euler_characteristic` (scikit-image's ``euler_number`` in the tests), and ``b1``
    (tunnels; holes in 2D) from the Euler-Poincare formula. Outside the image counts as
    background. An empty mask gives ``(0, 0, 0, 0)``.

    >>> ring = np.ones((3, 3), bool); ring[1, 1] = False
    >>> topology(ring)
    (0, 1, 1, 0)
    """
    mask = np.asarray(mask, bool)
    if not mask.any():
        return 0, 0, 0, 0
    # Topology is unchanged by cropping to the bounding box with one background voxel around it.
    padded = np.pad(mask[_bounding_box(mask)], 1, constant_values=False)
    chi = euler_characteristic(padded)
    b0 = int(ndimage.label(padded, structure=np.ones((3,) * mask.ndim, bool))[1])
    background = int(ndimage.label(~padded, structure=ndimage.generate_binary_structure(mask.ndim, 1))[1])
    enclosed = background - 1  # the component touching the padding is the outside
    if mask.ndim == 2:
        return chi, b0, enclosed, 0
    return chi, b0, b0 + enclosed - chi, enclosed


def topology_errors(reference: tuple[int, ...], prediction: tuple[int, ...]) -> dict[str, float]:
    """``{euler, b0, b1, b2}``: absolute differences of two :func:`topology` results.

    >>> topology_errors((2, 1, 0, 1), (1, 2, 1, 0))
    {'euler': 1.0, 'b0': 1.0, 'b1': 1.0, 'b2': 1.0}
    """
    return {name: float(abs(p - r)) for name, r, p in zip(TOPOLOGY_METRICS, reference, prediction)}


@dataclass
class MethodCaseResult:
    """One method's result on one case: confusion table; per region HD95 and NSD (NaN if a side is
    empty) and the prediction's :func:`topology`, when asked for."""

    labels: np.ndarray
    table: np.ndarray
    hd95: dict[tuple[int, ...], float] = field(default_factory=dict)
    nsd: dict[tuple[int, ...], float] = field(default_factory=dict)
    topology: dict[tuple[int, ...], tuple[int, int, int, int]] = field(default_factory=dict)


@dataclass
class CaseResult:
    case: str
    geometry: Geometry
    methods: dict[str, MethodCaseResult]
    reference_labels: tuple[int, ...]  # label values present in the reference (ignore label excluded)
    # per region (with compute_topology): the reference's topology, also for cases without prediction
    reference_topology: dict[tuple[int, ...], tuple[int, int, int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class CaseTask:
    """Work for one case: the reference and every method's prediction file (read once each).

    ``hd95_regions`` (the regions of every mask metric: HD95, NSD, topology) ``None`` means
    "every foreground label present" (default regions).
    """

    case: str
    reference: str
    predictions: tuple[tuple[str, str], ...]
    ignore_label: int | None = None
    compute_hd95: bool = False
    hd95_regions: tuple[tuple[int, ...], ...] | None = None
    compute_nsd: bool = False
    nsd_tolerance_mm: float = 1.0
    compute_topology: bool = False


def evaluate_case(task: CaseTask) -> CaseResult:
    """Read one case's files and compute its confusion tables (and the mask metrics asked for).
    Runs in worker processes."""
    reference, geometry = read_segmentation(task.reference)
    results = {}
    reference_topology: dict[tuple[int, ...], tuple[int, int, int, int]] = {}
    for method, path in task.predictions:
        prediction, pred_geometry = read_segmentation(path)
        check_same_geometry(task.case, geometry, pred_geometry, method)
        labels, table = confusion_table(reference, prediction, task.ignore_label)
        result = MethodCaseResult(labels, table)
        if task.compute_hd95 or task.compute_nsd or task.compute_topology:
            regions = task.hd95_regions
            if regions is None:
                regions = tuple((int(v),) for v in labels if v != 0)
            for region in regions:
                _mask_metrics(task, result, reference, prediction, region, geometry, reference_topology)
        results[method] = result
    if results:
        first = next(iter(results.values()))
        reference_labels = tuple(int(v) for v, n in zip(first.labels, first.table.sum(axis=1)) if n > 0)
    else:  # every prediction of this case is missing: still needed for default regions and label checks
        reference_labels = tuple(int(v) for v in np.flatnonzero(np.bincount(reference.ravel()))
                                 if v != task.ignore_label)
    if task.compute_topology:  # also for regions no prediction has (missing predictions, --missing worst)
        regions = task.hd95_regions or tuple((v,) for v in reference_labels if v != 0)
        for region in regions:
            if region not in reference_topology:
                reference_topology[region] = topology(np.isin(reference, region))
    return CaseResult(task.case, geometry, results, reference_labels, reference_topology)


def _mask_metrics(task: CaseTask, result: MethodCaseResult, reference, prediction, region, geometry,
                  reference_topology: dict) -> None:
    ref_mask = np.isin(reference, region)
    pred_mask = np.isin(prediction, region)
    if task.ignore_label is not None:
        pred_mask &= reference != task.ignore_label
    if task.compute_topology:
        if region not in reference_topology:  # the reference's topology once, whatever the number of methods
            reference_topology[region] = topology(ref_mask)
        result.topology[region] = topology(pred_mask)
    if not (task.compute_hd95 or task.compute_nsd):
        return
    if not ref_mask.any() or not pred_mask.any():
        # scored by policy in the parent (see hd95_empty_value)
        result.hd95[region] = result.nsd[region] = float("nan")
        return
    to_pred, to_ref = surface_distances(ref_mask, pred_mask, geometry.spacing)
    if task.compute_hd95:
        result.hd95[region] = hd95_from_distances(to_pred, to_ref)
    if task.compute_nsd:
        result.nsd[region] = nsd_from_distances(to_pred, to_ref, task.nsd_tolerance_mm)
