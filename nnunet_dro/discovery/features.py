"""Per-case features for subgroup discovery: error, hardness, volumes and image intensity.

Column names say what a column is, so that the description can put it in words:

- ``dice:REGION`` / ``hd95:REGION``: the evaluation's scores (Dice in percent, HD95 in mm);
- ``dice_rank:REGION``: the case's Dice as a percentile rank in the cohort (0 = the worst case);
- ``hardness:stale_loss`` / ``hardness:draw_share``: from a DRO training's ``dro_hardness.csv``;
- ``ref_volume:REGION`` / ``pred_volume:REGION``: volumes in mL;
- ``volume_error:REGION``: (predicted - reference volume) / reference volume in percent, the
  signed error: a systematic under- or over-segmentation (a margin, a missed structure) that
  Dice and HD95 share with mere boundary noise but this column tells apart (NaN where the
  reference lacks the region);
- ``intensity:REGION``: median image intensity inside the reference region, in standard deviations
  of the brain (foreground) from its mean, so that scanners and bias fields compare;
- ``contrast:REGION``: (mean inside - mean in a 2-voxel shell around it) / foreground standard
  deviation: how well the region stands out from its surroundings.

Error columns (:data:`ERROR_KINDS`) are what the clustering up-weights.

>>> ref = np.zeros((8, 8, 8), np.uint8); ref[2:6, 2:6, 2:6] = 1
>>> image = np.where(ref == 1, 2.0, 1.0); image[0] = 0.0
>>> feats = region_features(ref, image, ref, [Region("blob", (1,))], spacing=(2.0, 1.0, 1.0))
>>> feats["ref_volume:blob"], feats["pred_volume:blob"]
(0.128, 0.128)
>>> round(feats["contrast:blob"], 2) > 0
True
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import ndimage

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.regions import Region

#: feature kinds that measure the network's error (up-weighted in the clustering)
ERROR_KINDS = ("dice", "dice_rank", "hd95", "hardness", "volume_error")
#: voxels of the shell around a region that its contrast is measured against
SHELL_VOXELS = 2


def kind_of(column: str) -> str:
    """``"ref_volume:cerebellum"`` -> ``"ref_volume"``."""
    return column.split(":", 1)[0]


def region_of(column: str) -> str:
    """``"ref_volume:cerebellum"`` -> ``"cerebellum"`` (``""`` for case-wide features)."""
    return column.split(":", 1)[1] if ":" in column else ""


def region_features(reference: np.ndarray, image: np.ndarray | None, prediction: np.ndarray | None,
                    regions: Sequence[Region], spacing: Sequence[float]) -> dict[str, float]:
    """Volumes (mL) and intensity features of one case; see the module docstring.

    ``image`` or ``prediction`` ``None``: their features are left out. A region absent from the
    reference has volume 0 and NaN intensity features.
    """
    voxel_ml = float(np.prod([float(s) for s in spacing])) / 1000.0
    out: dict[str, float] = {}
    scale = None
    if image is not None:
        if image.shape != reference.shape:
            raise UserError(f"image shape {image.shape} differs from the reference's {reference.shape}")
        foreground = image[reference > 0] if (reference > 0).any() else image.ravel()
        mean, sd = float(foreground.mean()), float(foreground.std())
        scale = (mean, sd if sd > 0 else 1.0)
    structure = ndimage.generate_binary_structure(reference.ndim, 1)
    for region in regions:
        mask = np.isin(reference, region.labels)
        out[f"ref_volume:{region.name}"] = float(mask.sum()) * voxel_ml
        if prediction is not None:
            out[f"pred_volume:{region.name}"] = float(np.isin(prediction, region.labels).sum()) * voxel_ml
            reference_ml = out[f"ref_volume:{region.name}"]
            out[f"volume_error:{region.name}"] = (100.0 * (out[f"pred_volume:{region.name}"] - reference_ml)
                                                  / reference_ml if reference_ml > 0 else math.nan)
        if scale is None:
            continue
        if not mask.any():
            out[f"intensity:{region.name}"] = out[f"contrast:{region.name}"] = math.nan
            continue
        inside = image[mask]
        shell = ndimage.binary_dilation(mask, structure, iterations=SHELL_VOXELS) & ~mask
        around = image[shell] if shell.any() else inside
        out[f"intensity:{region.name}"] = (float(np.median(inside)) - scale[0]) / scale[1]
        out[f"contrast:{region.name}"] = (float(inside.mean()) - float(around.mean())) / scale[1]
    return out


def error_features(per_case: pd.DataFrame, method: str | None = None) -> pd.DataFrame:
    """Dice/HD95 per region and Dice ranks from an evaluation's per-case table (columns ``case``,
    ``region``, ``metric``, ``value``, and ``method`` when several): one row per case (index).

    >>> table = pd.DataFrame({"case": ["a", "b", "c"], "region": ["wm"] * 3, "metric": ["dice"] * 3,
    ...                       "value": [90.0, 50.0, 70.0]})
    >>> error_features(table)[["dice:wm", "dice_rank:wm"]].values.tolist()
    [[90.0, 1.0], [50.0, 0.0], [70.0, 0.5]]
    """
    table = per_case
    if method is not None and "method" in table:
        table = table[table["method"] == method]
    table = table[table["metric"].isin(["dice", "hd95"])]
    if table.empty:
        raise UserError("no Dice or HD95 scores to discover groups from")
    wide = table.pivot_table(index="case", columns=["metric", "region"], values="value", aggfunc="first")
    wide.columns = [f"{metric}:{region}" for metric, region in wide.columns]
    order = list(dict.fromkeys(table["region"]))
    columns = [f"{m}:{r}" for m in ("dice", "hd95") for r in order if f"{m}:{r}" in wide]
    wide = wide[columns]
    for region in order:
        if f"dice:{region}" in wide:
            wide[f"dice_rank:{region}"] = percentile_rank(wide[f"dice:{region}"])
    wide.index.name = "case"
    return wide


def percentile_rank(values: pd.Series) -> pd.Series:
    """Rank in [0, 1] (0 = the lowest value, ties share their mean rank); NaN stays NaN."""
    known = values.notna().sum()
    if known <= 1:
        return values.notna().astype(float).where(values.notna()) * 0.0
    return (values.rank(method="average") - 1) / (known - 1)


def read_hardness(tables: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Per-case hardness from one or more ``dro_hardness.csv`` tables (columns ``case``,
    ``stale_loss``, ``times_drawn``; one table per fold of a cross-validation): the mean stale loss
    and the mean share of the draws over the tables that list the case.

    >>> a = pd.DataFrame({"case": ["x", "y"], "stale_loss": [1.0, 0.0], "times_drawn": [30, 10]})
    >>> b = pd.DataFrame({"case": ["x"], "stale_loss": [0.5], "times_drawn": [5]})
    >>> read_hardness([a, b]).round(3).values.tolist()
    [[0.75, 0.875], [0.0, 0.25]]
    """
    rows = []
    for table in tables:
        missing = {"case", "stale_loss", "times_drawn"} - set(table.columns)
        if missing:
            raise UserError(f"hardness table lacks column(s) {', '.join(sorted(missing))}")
        total = float(table["times_drawn"].sum()) or 1.0
        rows.append(pd.DataFrame({"case": table["case"].astype(str),
                                  "hardness:stale_loss": table["stale_loss"].astype(float),
                                  "hardness:draw_share": table["times_drawn"].astype(float) / total}))
    if not rows:
        return pd.DataFrame(columns=["hardness:stale_loss", "hardness:draw_share"])
    return pd.concat(rows).groupby("case").mean()


def feature_table(errors: pd.DataFrame, per_case_regions: Mapping[str, Mapping[str, float]],
                  hardness: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per case of ``errors`` (index ``case``): error columns, hardness where the case has
    it, then the region features."""
    regions = pd.DataFrame.from_dict(dict(per_case_regions), orient="index")
    table = errors.copy()
    if hardness is not None and not hardness.empty:
        table = table.join(hardness, how="left")
    if not regions.empty:
        table = table.join(regions, how="left")
    table.index.name = "case"
    return table
