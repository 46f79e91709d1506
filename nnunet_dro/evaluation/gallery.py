"""The gallery of worst cases: ``worst_<metric>.png``, what each group's tail looks like.

Tables say *that* a group's worst tenth is bad; this figure shows *what* it looks like. For each
group column (``all`` without a group table), group, region and method, the ``k`` worst cases by
the metric's direction (ties: case id order) are drawn side by side: the image (first channel,
``CASE_0000``) at the slice where reference and prediction disagree most, with the reference
contour in :data:`REFERENCE_COLOUR` (solid) and the prediction's in :data:`PREDICTION_COLOUR`
(dashed); the title gives the case id, its group and its score.

The slice lies in the plane that suits the voxel spacing: across the axis of the largest spacing
(thick slices of an anisotropic scan are cut along, not across, so the panel is one acquired
slice), across a one-voxel axis for 2D cases (a one-slice NIfTI, a PNG). One case's volumes are
in memory at a time: each case shown is read once (image, reference, prediction), cut into one 2D
slice per region, and its volumes let go.

>>> import numpy as np
>>> plane_axis((1, 64, 64), (1.0, 0.5, 0.5)), plane_axis((40, 256, 256), (3.0, 0.9, 0.9))
(0, 0)
>>> plane_axis((256, 256, 40), (0.9, 0.9, 3.0)), plane_axis((64, 64, 64), (1.0, 1.0, 1.0))
(2, 0)
>>> reference = np.zeros((3, 4, 4), bool); prediction = reference.copy()
>>> reference[1, 1:3, 1:3] = True; prediction[2, 0, 0] = True
>>> worst_slice(reference, prediction, 0)  # slice 1: 4 voxels of disagreement, slice 2: 1
1
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.groups import ALL
from nnunet_dro.evaluation.io import SEGMENTATION_ENDINGS, read_segmentation, split_case_id
from nnunet_dro.evaluation.metrics import METRIC_INFO

#: Fixed contour colours (and line styles, so the two stay apart without colour vision).
REFERENCE_COLOUR = "#00e676"  # green, solid
PREDICTION_COLOUR = "#ff1744"  # red, dashed
LEGEND_TEXT = "reference: green, solid; prediction: red, dashed"
#: A spacing this much larger than the finest one makes an axis "thick": the panel cuts across it.
ANISOTROPY_RATIO = 1.5
PANEL_INCHES = 2.3
DPI = 80


@dataclass
class GallerySource:
    """What the gallery needs beyond the scores: the files of every case, and how many to show."""

    k: int
    images: dict[str, str]  # case -> image file (first channel)
    references: dict[str, str]  # case -> reference segmentation
    predictions: dict[str, dict[str, str]]  # method -> case -> prediction file (folder methods only)
    regions: dict[str, tuple[int, ...]]  # region name -> labels
    images_folder: str = ""


def default_images_folder(reference: str) -> str | None:
    """The images beside an nnU-Net labels folder: ``labelsTs`` -> ``imagesTs``, ``labelsTr`` ->
    ``imagesTr`` (how cross-validation input finds its raw data); None where there is none."""
    folder = Path(reference)
    name = folder.name
    if not name.startswith("labels"):
        return None
    candidate = folder.parent / ("images" + name[len("labels"):])
    return str(candidate) if candidate.is_dir() else None


def list_images(folder: str, cases) -> dict[str, str]:
    """case -> its first-channel image in ``folder`` (``CASE_0000.ending``, or ``CASE.ending``).

    One line naming the folder and a case when a case has no image: a gallery with a blank
    panel would look like a prediction on an empty scan.
    """
    if not os.path.isdir(folder):
        raise UserError(f"-i {folder}: not a folder of images")
    found: dict[str, str] = {}
    plain: dict[str, str] = {}
    for name in sorted(os.listdir(folder)):
        split = split_case_id(name)
        if split is None:
            continue
        stem = split[0]
        if stem.endswith("_0000"):
            found[stem[:-5]] = os.path.join(folder, name)
        else:
            plain[stem] = os.path.join(folder, name)
    images = {}
    for case in cases:
        path = found.get(case) or plain.get(case)
        if path is None:
            raise UserError(f"-i {folder}: no image for case {case!r} (expected {case}_0000 with one of "
                            f"{', '.join(SEGMENTATION_ENDINGS)}); give the images folder of these cases, or "
                            f"--gallery 0 for no gallery")
        images[case] = path
    return images


def read_image(path: str) -> np.ndarray:
    """An image as float32 in numpy axis order (z, y, x), as :func:`read_segmentation` orders
    labels; 2D images get a leading axis of 1, an RGB PNG its mean over the colour channels."""
    import SimpleITK as sitk

    try:
        image = sitk.ReadImage(path)
    except RuntimeError as e:
        raise UserError(f"cannot read image {path}: {str(e).strip().splitlines()[-1]}") from None
    array = sitk.GetArrayFromImage(image).astype(np.float32)
    if image.GetNumberOfComponentsPerPixel() > 1:
        array = array.mean(axis=-1)
    if array.ndim == 4:  # a 4D NIfTI (channel last in SimpleITK's order is first here): the first channel
        array = array[0]
    return array if array.ndim == 3 else array[np.newaxis]


def plane_axis(shape, spacing) -> int:
    """The axis the panel cuts across: a one-voxel axis (2D case), else the axis of the largest
    spacing when it is at least :data:`ANISOTROPY_RATIO` times the finest, else axis 0."""
    if len(shape) == 2:
        return 0
    for axis, n in enumerate(shape):
        if n == 1:
            return axis
    spacing = np.asarray(spacing, float)
    thick = int(np.argmax(spacing))
    return thick if spacing[thick] >= ANISOTROPY_RATIO * spacing.min() else 0


def worst_slice(reference: np.ndarray, prediction: np.ndarray, axis: int) -> int:
    """The slice across ``axis`` with the most voxels where the masks disagree; where they agree
    everywhere, the one with the most reference voxels; where both are empty, the middle one."""
    other = tuple(a for a in range(reference.ndim) if a != axis)
    for mask in (reference ^ prediction, reference):
        counts = mask.sum(axis=other)
        if counts.any():
            return int(np.argmax(counts))  # ties: the first slice
    return reference.shape[axis] // 2


@dataclass
class _Panel:
    image: np.ndarray
    reference: np.ndarray
    prediction: np.ndarray | None
    aspect: float
    where: str  # "axis 0, slice 12 of 40"


def _as_3d(array: np.ndarray) -> np.ndarray:
    return array if array.ndim == 3 else array[np.newaxis]


def _case_panels(source: GallerySource, method: str, case: str) -> dict[str, _Panel]:
    """Read one case (image, reference, prediction) once, cut every region's slice, keep only the slices."""
    reference, geometry = read_segmentation(source.references[case])
    reference = _as_3d(reference)
    spacing = tuple(geometry.spacing) if len(geometry.spacing) == 3 else (1.0,) + tuple(geometry.spacing)
    prediction_file = source.predictions.get(method, {}).get(case)
    prediction = None if prediction_file is None else _as_3d(read_segmentation(prediction_file)[0])
    image = _as_3d(read_image(source.images[case]))
    if image.shape != reference.shape:
        raise UserError(f"image {source.images[case]}: shape {image.shape} does not match its reference "
                        f"{source.references[case]} {reference.shape} (numpy order)")
    axis = plane_axis(reference.shape, spacing)
    shown = [s for a, s in enumerate(spacing) if a != axis]
    panels = {}
    for region, labels in source.regions.items():
        ref_mask = np.isin(reference, labels)
        pred_mask = np.zeros_like(ref_mask) if prediction is None else np.isin(prediction, labels)
        index = worst_slice(ref_mask, pred_mask, axis)
        cut = tuple(index if a == axis else slice(None) for a in range(3))
        panels[region] = _Panel(image=np.ascontiguousarray(image[cut]), reference=ref_mask[cut].copy(),
                                prediction=None if prediction is None else pred_mask[cut].copy(),
                                aspect=shown[0] / shown[1],
                                where=f"slice {index + 1}/{reference.shape[axis]} across axis {axis}")
    return panels


def worst_cases(per_case: pd.DataFrame, metric: str, method: str, region: str, column: str | None,
                group: str, k: int) -> pd.DataFrame:
    """The ``k`` worst scored rows of one method, region and group by the metric's direction
    (NaN scores left out, ties broken by case id)."""
    frame = per_case[(per_case["metric"] == metric) & (per_case["method"] == method)
                     & (per_case["region"] == region)]
    if column is not None:
        frame = frame[frame[column] == group]
    frame = frame[frame["value"].notna()]
    return frame.sort_values(["value", "case"], ascending=[METRIC_INFO[metric].higher_is_better, True],
                             kind="mergesort").head(k)


def _rows(group_columns, group_orders, regions):
    """(group column, group, region) of every gallery row, in the report's display order."""
    blocks = [(column, list(group_orders[column])) for column in group_columns] or [(None, [ALL])]
    for column, groups in blocks:
        for group in groups:
            for region in regions:
                yield column, group, region


def _score_text(metric: str, value: float) -> str:
    units = {"dice": " %", "vs": " %", "nsd": " %", "hd95": " mm"}
    decimals = 2 if metric == "hd95" else 1 if metric in units or not float(value).is_integer() else 0
    return f"{metric} {value:.{decimals}f}{units.get(metric, '')}"


def write_gallery(path: Path, per_case: pd.DataFrame, metric: str, source: GallerySource,
                  group_columns, group_orders, methods, cache: dict | None = None) -> bool:
    """Draw ``worst_<metric>.png`` at ``path``: one row per group and region, ``k`` panels per
    method side by side; False (nothing written) when no case has a score. ``cache``: the slices
    cut so far, (case, method) -> region -> panel, shared by the metrics' galleries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    methods = [m for m in methods if m in source.predictions]
    rows = []
    for column, group, region in _rows(group_columns, group_orders, list(source.regions)):
        worst = [worst_cases(per_case, metric, method, region, column, group, source.k) for method in methods]
        if any(len(w) for w in worst):
            rows.append((column, group, region, worst))
    if not rows:
        return False
    cache = {} if cache is None else cache
    k = source.k
    columns = k * len(methods)
    # One Axes in inches over the whole figure, every panel placed in it: an Axes per panel (and
    # tight_layout, set_title) cost more than reading the cases
    left, header, title, gap = 0.45, 0.55, 0.32, 0.08
    width, height = left + PANEL_INCHES * columns, header + (PANEL_INCHES + title) * len(rows)
    figure = plt.figure(figsize=(width, height))
    ax = figure.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    direction = "lowest" if METRIC_INFO[metric].higher_is_better else "highest"
    outlines: tuple[list, list] = ([], [])  # reference, prediction: one line collection each
    for r, (column, group, region, worst) in enumerate(rows):
        bottom = height - header - (r + 1) * (PANEL_INCHES + title)
        label = f"{column} = {group}" if column is not None else "all cases"
        ax.text(0.12, bottom + PANEL_INCHES / 2, f"{label}\n{region}", rotation=90, ha="left", va="center",
                fontsize=8)
        for m, method in enumerate(methods):
            for c, row in enumerate(worst[m].itertuples()):
                if (row.case, method) not in cache:
                    cache[row.case, method] = _case_panels(source, method, row.case)
                cell = (left + (m * k + c) * PANEL_INCHES + gap / 2, bottom, PANEL_INCHES - gap, PANEL_INCHES)
                _draw(ax, cache[row.case, method][region], cell,
                      f"{method} · {row.case}\n{group if column is not None else 'all'} · "
                      f"{_score_text(metric, float(row.value))}", outlines)
    ax.add_collection(LineCollection(outlines[0], colors=REFERENCE_COLOUR, linewidths=1.2, linestyles="solid"))
    ax.add_collection(LineCollection(outlines[1], colors=PREDICTION_COLOUR, linewidths=1.2, linestyles="dashed"))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    handles = [Line2D([], [], color=REFERENCE_COLOUR, linestyle="solid", label="reference"),
               Line2D([], [], color=PREDICTION_COLOUR, linestyle="dashed", label="prediction")]
    figure.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 1 - 0.22 / height), fontsize=8, ncol=2,
                  frameon=False)
    figure.text(0.05 / width, 1 - 0.08 / height, f"The {k} worst cases by {METRIC_INFO[metric].title} ({direction} "
                f"first) per group and region", fontsize=9, ha="left", va="top")
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return True


def _outline(xs: np.ndarray, ys: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """The 0.5 iso-lines of ``mask`` on the grid ``xs`` x ``ys``, by contourpy (what ``ax.contour``
    runs, without a ContourSet per panel: creating and drawing 160 of those was a third of the time)."""
    from contourpy import contour_generator

    grid_x, grid_y = np.meshgrid(xs, ys)
    return list(contour_generator(x=grid_x, y=grid_y, z=mask.astype(np.float64)).lines(0.5))


def _draw(ax, panel: _Panel, cell: tuple[float, float, float, float], title: str,
          outlines: tuple[list, list]) -> None:
    """One panel in ``cell`` (x, y, width, height in inches), its pixels at their aspect ratio; its
    reference and prediction outlines are added to ``outlines`` (drawn once for all panels)."""
    x, y, cell_width, cell_height = cell
    rows, cols = panel.image.shape
    scale = min(cell_width / cols, cell_height / (rows * panel.aspect))
    w, h = cols * scale, rows * panel.aspect * scale
    x0, y0 = x + (cell_width - w) / 2, y + (cell_height - h) / 2
    low, high = np.percentile(panel.image, [1, 99])
    ax.imshow(panel.image, cmap="gray", vmin=low, vmax=high if high > low else low + 1, origin="upper",
              extent=(x0, x0 + w, y0, y0 + h), aspect="auto", interpolation="nearest")
    xs = x0 + (np.arange(cols) + 0.5) * (w / cols)  # pixel centres; row 0 at the top
    ys = y0 + h - (np.arange(rows) + 0.5) * (h / rows)
    for mask, lines in ((panel.reference, outlines[0]), (panel.prediction, outlines[1])):
        if mask is not None and mask.any():
            lines.extend(_outline(xs, ys, mask))
    ax.text(x + cell_width / 2, y + cell_height + 0.03,
            title + (" (no prediction)" if panel.prediction is None else ""), ha="center", va="bottom", fontsize=7)
    ax.text(x0 + 0.03, y0 + 0.03, panel.where, fontsize=5, color="white", va="bottom")


def gallery_images(k: int, images_folder: str | None, reference: str, cases, warn) -> tuple[dict[str, str], str] | None:
    """(case -> image, folder) for the gallery, checked before any case is read; None for no gallery.

    ``images_folder`` (``-i``) must hold every case's image (one line naming the folder and the case
    if not). Without it, the images beside the references (``labelsTs`` -> ``imagesTs``) are used
    where every case has one; where some lack one, a warning says so and there is no gallery.
    """
    if k == 0:
        return None
    if images_folder is not None:
        return list_images(images_folder, cases), os.path.abspath(images_folder)
    beside = default_images_folder(reference)
    if beside is None:
        return None
    try:
        return list_images(beside, cases), os.path.abspath(beside)
    except UserError as e:
        warn(f"warning: no gallery of worst cases: {e} (found beside the references; give -i IMAGES)")
        return None


def gallery_source(k: int, images: tuple[dict[str, str], str] | None, references: Mapping[str, str],
                   predictions: Mapping[str, Mapping[str, str] | None], regions) -> GallerySource | None:
    """Everything the gallery reads, once the regions are known; None without images."""
    if images is None:
        return None
    return GallerySource(k=k, images=images[0], references=dict(references),
                         predictions={name: dict(files) for name, files in predictions.items() if files is not None},
                         regions={r.name: tuple(r.labels) for r in regions}, images_folder=images[1])


__all__ = ["GallerySource", "LEGEND_TEXT", "default_images_folder", "gallery_images", "gallery_source",
           "list_images", "plane_axis", "read_image", "worst_cases", "worst_slice", "write_gallery"]
