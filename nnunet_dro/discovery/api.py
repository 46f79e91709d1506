"""``discover(...)``: what ``nnunet_dro discover`` runs.

Inputs: a prediction folder with its reference folder, or an nnU-Net trainer folder (its
``fold_N/validation`` cross-validation predictions, the references its dataset's ``labelsTr``
unless ``reference`` is given, and each fold's ``dro_hardness.csv`` where a DRO trainer wrote one).
Scores come from :func:`nnunet_dro.evaluation.evaluate` (Dice, HD95, the same regions and checks);
volumes and intensity features from a second read of each case (:mod:`~.features`); images
(``images``: an ``imagesTr``/``imagesTs`` folder, first channel ``CASE_0000``) are optional.

Example (Python)::

    from nnunet_dro.discovery.api import discover
    summary = discover("pred", "labelsTs", "discovery", images="imagesTs", regions="feta")
    [(g["name"], g["size"], g["suspect_labels"]) for g in summary["groups"]]
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.discovery import clustering, description, features, report
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.crossval import dataset_labels_folder, gather_validation, is_trainer_folder
from nnunet_dro.evaluation.io import check_same_geometry, list_segmentations, read_segmentation
from nnunet_dro.evaluation.regions import Region
from nnunet_dro.processes import map_in_processes

HARDNESS_FILE = "dro_hardness.csv"
METHOD = "discover"
NOT_USED = ("The network's own (bottleneck) features are not used: this version clusters on scores, "
            "volumes and intensities only.")


def image_files(folder: str, cases: Sequence[str]) -> dict[str, str]:
    """case -> its first channel ``CASE_0000<ending>`` in ``folder``; UserError naming a case without one."""
    if not os.path.isdir(folder):
        raise UserError(f"-i {folder}: not a folder")
    by_case = {}
    for name in os.listdir(folder):
        stem, sep, rest = name.partition("_0000.")
        if sep and not name.startswith("."):
            by_case[stem] = os.path.join(folder, name)
    lacking = [c for c in cases if c not in by_case]
    if lacking:
        raise UserError(f"-i {folder}: no image {lacking[0]}_0000.* for case {lacking[0]} "
                        f"({len(lacking)} case(s) without one)")
    return {c: by_case[c] for c in cases}


def _read_image(path: str) -> np.ndarray:
    import SimpleITK as sitk

    try:
        return sitk.GetArrayFromImage(sitk.ReadImage(path)).astype(np.float64)
    except RuntimeError as e:
        raise UserError(f"cannot read image {path}: {str(e).strip().splitlines()[-1]}") from None


def _case_region_features(job) -> tuple[str, dict[str, float]]:
    case, ref_path, pred_path, image_path, regions, method = job
    reference, geometry = read_segmentation(ref_path)
    prediction = None
    if pred_path is not None:
        prediction, pred_geometry = read_segmentation(pred_path)
        check_same_geometry(case, geometry, pred_geometry, method)
    image = _read_image(image_path) if image_path is not None else None
    if image is not None and image.shape != reference.shape:
        raise UserError(f"image {image_path}: shape {image.shape} differs from its reference's {reference.shape}")
    return case, features.region_features(reference, image, prediction, regions, geometry.spacing)


def hardness_tables(trainer_folder: Path) -> list[pd.DataFrame]:
    """Every ``fold_*/dro_hardness.csv`` of a trainer folder (none for a plain nnU-Net trainer)."""
    tables = []
    for path in sorted(trainer_folder.glob(f"fold_*/{HARDNESS_FILE}")):
        try:
            tables.append(pd.read_csv(path, dtype={"case": str}))
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read {path}: {e}") from None
    return tables


@dataclass(frozen=True)
class DiscoveryOptions:
    """How :func:`discover` reads, scores and clusters (everything but the three folders).

    ``images``: an ``imagesTr``/``imagesTs`` folder (None: no intensity features); ``regions``: as
    ``nnunet_dro evaluate --regions``; ``hd95``: score HD95 besides Dice; ``min_size``: a count of
    cases or a share (a float in (0, 1)); ``max_groups``: most groups tried; ``error_weight``: how
    many times the error features count; ``n_bootstrap``, ``seed``: the intervals of group - rest
    and the mixture's seed; ``num_processes``: reading processes (None: ``nnUNet_def_n_proc`` or
    8); ``folds``: the folds of a trainer folder (None: all); ``echo``: where notes go (None:
    stderr); ``name``: the predictions' name in messages (default: the folder's name);
    ``missing``: the evaluation's ``--missing`` policy (``error``, ``worst``: a missing prediction
    scores Dice 0 and the worst HD95, ``skip``: its case is left out); ``progress``: progress bars
    on stderr while cases are read.

    >>> DiscoveryOptions(max_groups=4).with_overrides(seed=3).seed
    3
    """

    images: str | None = None
    regions: str | None = None
    hd95: bool = True
    min_size: int | float = 10
    max_groups: int = 8
    error_weight: int = clustering.ERROR_WEIGHT
    n_bootstrap: int = 1000
    seed: int = 0
    num_processes: int | None = None
    folds: Sequence[int] | None = None
    echo: Callable[[str], None] | None = None
    name: str | None = None
    missing: str = "error"
    progress: bool = False

    def with_overrides(self, **overrides: Any) -> DiscoveryOptions:
        """A copy with ``overrides`` replaced; an unknown name is a TypeError."""
        return _resolve(self, overrides, "with_overrides")


def _resolve(options: DiscoveryOptions | None, overrides: dict[str, Any], function: str) -> DiscoveryOptions:
    if options is not None and not isinstance(options, DiscoveryOptions):
        raise TypeError(f"{function}(): options must be a DiscoveryOptions, not {type(options).__name__}")
    names = {f.name for f in dataclasses.fields(DiscoveryOptions)}
    unknown = [key for key in overrides if key not in names]
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    base = options if options is not None else DiscoveryOptions()
    return dataclasses.replace(base, **overrides) if overrides else base


def discover(prediction: str, reference: str | None, output: str | None,
             options: DiscoveryOptions | None = None, **overrides) -> dict:
    """Discover candidate hard subgroups; write the report folder ``output`` (None: compute only)
    and return the summary written to ``groups.json``.

    ``options`` is a :class:`DiscoveryOptions` (default: its defaults); keyword arguments named
    like its fields override it (``discover(pred, ref, out, images="imagesTs")``), any other
    keyword is a TypeError."""
    from nnunet_dro.evaluation.api import default_num_processes, evaluate

    o = _resolve(options, overrides, "discover")
    images, folds, echo, name = o.images, o.folds, o.echo, o.name
    echo = echo or (lambda text: print(text, file=sys.stderr))
    method = name or os.path.basename(os.path.normpath(prediction)) or METHOD
    if output is not None:
        report.check_output(output)
    trainer = is_trainer_folder(prediction)
    hardness = None
    if trainer:
        cv = gather_validation(method, prediction, folds)
        pred_files = cv.files
        if reference is None:
            reference = str(dataset_labels_folder([cv]))
        hardness = features.read_hardness(hardness_tables(Path(prediction)))
        source = f"the cross-validation of {prediction} (references {reference})"
    else:
        if reference is None:
            raise UserError(f"-ref is needed with a prediction folder ({prediction} has no fold_N folders)")
        if folds is not None:
            raise UserError("--folds goes with a trainer folder as -pred")
        pred_files = list_segmentations(prediction, "prediction folder")
        source = f"{prediction} against {reference}"
    processes = default_num_processes() if o.num_processes is None else o.num_processes
    result = evaluate(reference, {method: prediction}, None, regions=o.regions,
                      metrics=["dice", "hd95"] if o.hd95 else ["dice"], num_processes=processes,
                      progress=o.progress, folds=folds, echo=echo, missing=o.missing)
    errors = features.error_features(result.per_case, method)
    cases = list(errors.index)
    ref_files = list_segmentations(reference, "reference folder")
    image_paths = image_files(images, cases) if images else {}
    region_list: list[Region] = list(result.regions)
    jobs = [(c, ref_files[c], pred_files.get(c), image_paths.get(c), region_list, method) for c in cases]
    from tqdm import tqdm

    # the second read (volumes, intensities) takes as long as the scoring: a bar of its own, as evaluate's
    bar = tqdm(total=len(jobs), desc="Reading volumes and images", unit="case", file=sys.stderr,
               disable=not o.progress, leave=False)
    try:
        if processes > 1 and len(jobs) > 1:
            pairs = map_in_processes(_case_region_features, jobs, cases, min(processes, len(jobs)),
                                     on_result=lambda pair: bar.update(), preload=[__name__])
            per_region = dict(pairs)
        else:
            per_region = {}
            for job in jobs:
                case, values = _case_region_features(job)
                per_region[case] = values
                bar.update()
    finally:
        bar.close()
    per_region = {c: per_region[c] for c in cases}
    if hardness is not None and not hardness.empty:
        hardness = hardness[hardness.index.isin(cases)]
    table = features.feature_table(errors, per_region, hardness)
    summary, annotated = summarise(table, source=source, min_size=o.min_size, max_groups=o.max_groups,
                                   error_weight=o.error_weight, n_bootstrap=o.n_bootstrap, seed=o.seed,
                                   not_used=NOT_USED + ("" if images else " No images given (-i): no intensity "
                                                                          "features."))
    if summary.get("blocked"):
        echo(summary["blocked"]["text"])
    if output is not None:
        report.write_outputs(output, summary, annotated)
    return summary


def min_size_text(min_size: int | float) -> str:
    """``10`` -> ``"10"``, ``0.05`` -> ``"5%"`` (as the option is written)."""
    if isinstance(min_size, float):
        return f"{100 * min_size:g}%"
    return str(min_size)


def _blocked(found: clustering.Clustering, min_size: int | float) -> dict | None:
    """The line that says a better-fitting split was refused by the minimum group size, or None."""
    if found.blocked is None:
        return None
    sizes = found.blocked["sizes"]
    small = [n for n in sizes if n < found.min_size]
    given = min_size_text(min_size)
    shown = given if given == str(found.min_size) else f"{given} = {found.min_size} cases"
    text = (f"note: a split into {len(sizes)} groups ({', '.join(map(str, sizes))} cases) fitted better (lower BIC) "
            f"but was not reported: its group{'s' if len(small) > 1 else ''} of {', '.join(map(str, small))} "
            f"case{'s' if small != [1] else ''} {'are' if len(small) > 1 else 'is'} below --min-size {shown}; "
            f"--min-size {min(small)} would report {'them' if len(small) > 1 else 'it'}")
    return {**found.blocked, "below": small, "text": text}


def summarise(table: pd.DataFrame, *, source: str, min_size: int | float = 10, max_groups: int = 8,
              error_weight: int = clustering.ERROR_WEIGHT,
              n_bootstrap: int = 1000, seed: int = 0, not_used: str = "") -> tuple[dict, pd.DataFrame]:
    """Cluster a feature table and describe each group: ``(summary, table with the group column,
    membership probability and audit flags)``. Shared by the command and the benchmark script."""
    found = clustering.discover_clusters(table, min_size=min_size, max_groups=max_groups,
                                         error_weight=error_weight, seed=seed)
    flags = description.audit_flags(table)
    dice_columns = [c for c in table.columns if features.kind_of(c) == "dice"]
    dice = table[dice_columns].rename(columns=features.region_of)
    groups = []
    for g in range(found.k):
        in_group = found.labels == g
        tail = description.tail_table(dice, in_group, n_bootstrap, seed) if dice_columns else pd.DataFrame()
        groups.append({
            "name": report.group_name(g), "size": int(in_group.sum()),
            "cases": [str(c) for c in table.index[in_group]],
            "features": description.distinguishing_features(table, in_group) if found.k > 1 else [],
            "tail": tail.to_dict(orient="records"),
            "suspect_labels": description.suspect_labels(flags, in_group),
            "audit_flagged": int((flags[in_group] != "").sum()),
            "shared_audit_flag": dict(zip(("flag", "share"), description.shared_flag(flags, in_group))),
        })
    kinds = list(dict.fromkeys(features.kind_of(c) for c in found.columns))
    summary = {"n_cases": int(len(table)), "k": found.k, "groups": groups,
               "criterion": found.criterion.to_dict(orient="records"),
               "blocked": _blocked(found, min_size),
               "settings": {"source": source, "min_size": found.min_size, "min_size_given": min_size_text(min_size),
                            "max_groups": max_groups, "merge_distance": clustering.MERGE_DISTANCE,
                            "error_weight": error_weight, "n_bootstrap": n_bootstrap, "seed": seed,
                            "feature_kinds": kinds, "error_columns": found.error_columns, "not_used": not_used}}
    annotated = table.copy()
    annotated[report.GROUP_COLUMN] = [report.group_name(g) for g in found.labels]
    annotated["membership_probability"] = found.probabilities[np.arange(len(table)), found.labels]
    annotated["label_audit"] = flags.reindex(annotated.index).fillna("")
    return summary, annotated
