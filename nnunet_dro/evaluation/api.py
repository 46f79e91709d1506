"""``evaluate(...)``: stratified robustness evaluation of one or more prediction folders.

This is what ``nnunet_dro evaluate`` runs. It lists the cases, reads every reference and
prediction file once in a process pool (one confusion table per case and method, see
:mod:`nnunet_dro.evaluation.metrics`), scores every region, stratifies by subgroup, computes the
statistics and paired comparisons, and writes the report folder atomically.

Example (Python)::

    from nnunet_dro.evaluation import evaluate
    result = evaluate("labelsTs", {"ERM": "pred_erm", "DRO": "pred_dro"}, "report",
                      groups="subgroups.tsv", group_by=["condition"], regions="feta")
    result.summary.query("group == 'spina_bifida' and region == 'cerebellum'")[["method", "p10"]]
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation import reports
from nnunet_dro.evaluation.crossval import (
    SPLITS_FILE,
    CrossValidation,
    check_cases_in_reference,
    check_same_folds,
    dataset_labels_folder,
    describe_non_trainer_folder,
    gather_validation,
    is_trainer_folder,
    splits_file,
)
from nnunet_dro.evaluation.disparity import disparity_table
from nnunet_dro.evaluation.gallery import gallery_images, gallery_source
from nnunet_dro.evaluation.groups import NOT_IN_TABLE, GroupAssignment, assign_groups, groupings
from nnunet_dro.evaluation.io import SummaryCounts, list_segmentations, load_nnunet_summary
from nnunet_dro.evaluation.metrics import (
    MASK_METRICS,
    METRIC_INFO,
    TOPOLOGY_METRICS,
    CaseResult,
    CaseTask,
    dice_percent,
    evaluate_case,
    hd95_empty_value,
    region_counts,
    topology_errors,
    volume_similarity_percent,
)
from nnunet_dro.evaluation.options import EvaluationOptions, resolve_options
from nnunet_dro.evaluation.regions import Region, RegionSpec, default_regions, resolve_regions
from nnunet_dro.evaluation.result import EvaluationResult
from nnunet_dro.evaluation.stats import (
    CVAR_COLUMN,
    bootstrap_cvar_difference,
    bootstrap_mean_difference,
    bootstrap_percentile_difference,
    bootstrap_summary_intervals,
    cvar,
    holm,
    paired_wilcoxon,
    percentile_column,
    summarize,
    tail_quantile,
    wilcoxon_can_reach,
)

RESERVED_COLUMNS = ("method", "case", "region", "metric", "value", "note", "empty_policy", "missing_policy",
                    "group_column", "group")
EMPTY_POLICY_TEXT = {
    "one": "a region empty in both reference and prediction scores Dice 100 and VS 100, HD95 0 mm "
           "(--empty one, BraTS convention)",
    "nan": "a region empty in both reference and prediction is left out of the statistics "
           "(--empty nan, nnU-Net's convention)",
}
MISSING_POLICY_TEXT = {
    "error": "every reference case must have a prediction (--missing error)",
    "worst": "a missing prediction scores Dice 0, VS 0 and the worst HD95 (--missing worst)",
    "skip": "a case without prediction is left out for that method (--missing skip)",
}
HD95_TEXT = ("HD95 in mm: max of the two directed 95th percentiles of surface distances; with exactly one side "
             "empty (or a missing prediction under --missing worst) it is the image diagonal in mm")
NSD_TEXT = ("NSD in percent: surface voxels of either mask within the tolerance (mm) of the other mask's surface, "
            "over all surface voxels of both; exactly one side empty (or a missing prediction under "
            "--missing worst): 0")
TOPOLOGY_TEXT = ("topology errors: |chi(pred) - chi(ref)| (euler) and |b_k(pred) - b_k(ref)| (b0 components, b1 "
                 "tunnels, b2 cavities), 26-connected foreground and 6-connected background (8 and 4 in 2D); an "
                 "empty mask has chi = b0 = b1 = b2 = 0, so exactly one side empty needs no policy; a missing "
                 "prediction under --missing worst is scored as an empty prediction")
TAIL_TEXT = ("pXX is the value of the worst XX % of cases by the metric's direction: numpy's XXth percentile for "
             "metrics better high (dice, vs, nsd), the (100 - XX)th for metrics better low (hd95, topology "
             f"errors); {CVAR_COLUMN} is the mean of the worst ceil(n / 10) cases (integer arithmetic) by the "
             "same direction")
#: NSD tolerance (mm) of a region spec that carries none of its own (every spec but the presets).
DEFAULT_NSD_TOLERANCE_MM = 2.0


def default_nsd_tolerance(spec: RegionSpec) -> float:
    """The NSD tolerance in mm when ``--nsd-tolerance`` is not given: the preset's own
    (``RegionSpec.nsd_tolerance_mm``, kept when the preset is checked against a dataset.json),
    else 2 mm."""
    return DEFAULT_NSD_TOLERANCE_MM if spec.nsd_tolerance_mm is None else spec.nsd_tolerance_mm


def default_num_processes() -> int:
    """nnU-Net's default: ``nnUNet_def_n_proc`` or 8."""
    return int(os.environ.get("nnUNet_def_n_proc", 8))


@dataclass
class _Method:
    name: str
    source: str
    kind: str  # "folder" or "summary"
    files: dict[str, str] | None = None
    summary: dict[str, dict[frozenset[int], SummaryCounts]] | None = None
    cross_validation: CrossValidation | None = None

    @property
    def cases(self) -> set[str]:
        return set(self.files if self.kind == "folder" else self.summary)


@dataclass
class _Inputs:
    """The checked options and inputs that do not depend on the predictions."""

    metrics: list[str]
    percentiles: list[float]
    spec: RegionSpec
    ref_files: dict[str, str]
    assignment: GroupAssignment | None
    num_processes: int
    nsd_tolerance: float


@dataclass(frozen=True)
class _Scope:
    """What the scoring, summary and comparison steps run over, fixed once the cases are read: the
    methods (the first is the reference method), regions, metrics, percentiles, groups (columns and
    their display order), bootstrap resamples and the empty and missing policies."""

    methods: tuple[_Method, ...]
    regions: tuple[Region, ...]
    metrics: tuple[str, ...]
    percentiles: tuple[float, ...]
    group_columns: tuple[str, ...]
    group_orders: Mapping[str, Sequence[str]]
    n_bootstrap: int
    empty: str
    missing: str


def check_inputs(reference: str, method_names: Sequence[str], output: str | None,
                 options: EvaluationOptions | None = None, *,
                 select_cases: Callable[[dict[str, str]], dict[str, str]] | None = None, **overrides) -> _Inputs:
    """Check everything :func:`evaluate` can check before a prediction exists: the options, the
    report folder (``output``), the reference folder, the regions (a preset against the
    dataset.json beside the reference folder, see :func:`~nnunet_dro.evaluation.regions.resolve_regions`)
    and the group table.

    ``options`` (:class:`~nnunet_dro.evaluation.options.EvaluationOptions`, default: its defaults)
    with the keyword ``overrides`` applied, as for :func:`evaluate`; ``progress`` and ``folds`` are
    :func:`evaluate`'s own and ignored here. ``nnunet_dro ensemble`` calls it before predicting, so
    a typo in ``-ref`` or ``-regions`` is an error in seconds, not after hours of inference. Raises
    UserError; notes go to ``options.echo`` (None: none). ``select_cases`` (cross-validation input)
    checks and narrows the reference cases before the group table is matched to them.
    """
    options = resolve_options(options, overrides, "check_inputs")
    _check_method_names(method_names)
    echo, groups, group_by = options.echo, options.groups, options.group_by
    if output is not None:
        reports.check_report_folder(output)
    spec = resolve_regions(options.regions, reference, options.strict, echo)
    ref_files = list_segmentations(reference, "reference folder", spec.file_ending)
    if select_cases is not None:
        ref_files = select_cases(ref_files)
    assignment = None
    if groups:
        assignment = assign_groups(groups, options.case_column, list(group_by) if group_by else None,
                                   sorted(ref_files), partial=options.groups_partial)
        clash = [c for c in assignment.column_names if c in RESERVED_COLUMNS]
        if clash:
            raise UserError(f"group table {groups}: column name {clash[0]!r} is reserved for the report, rename it")
        if echo is not None:
            _warn_group_report(assignment, groups, echo)
    num_processes, nsd_tolerance = options.num_processes, options.nsd_tolerance
    return _Inputs(list(options.metrics), list(options.percentiles), spec, ref_files, assignment,
                   default_num_processes() if num_processes is None else num_processes,
                   default_nsd_tolerance(spec) if nsd_tolerance is None else float(nsd_tolerance))


def evaluate(reference: str | None, predictions: Mapping[str, str], output: str | None,
             options: EvaluationOptions | None = None, **overrides) -> EvaluationResult:
    """Evaluate prediction folders (or nnU-Net summary.json files) against a reference folder.

    ``options`` is an :class:`~nnunet_dro.evaluation.options.EvaluationOptions` (default: its
    defaults); keyword arguments named like its fields override it (``evaluate(ref, preds, out,
    metrics=["dice", "hd95"])``), any other keyword is a TypeError.

    ``predictions`` maps method names to folders (or summary.json files, Dice/VS only), in the
    order methods are compared (the first is the reference method of ``comparison.csv``).
    ``output`` is the report folder (``None``: compute only); it is checked before any file is
    read, and a failed run leaves it as it was. Dice, VS and NSD are in percent (NSD at
    ``nsd_tolerance`` mm, default by preset: :func:`default_nsd_tolerance`), HD95 in mm, the
    topology errors (``--metrics topology``: euler, b0, b1, b2) in counts. Empty
    masks: see ``empty`` (``"one"``: both-empty region scores 100; ``"nan"``: left out). Missing
    predictions: see ``missing``. Regions: ``regions`` (default: the labels of the dataset.json
    beside the reference folder, else each foreground label found). With ``strict`` (default) a
    region whose labels occur in no reference file, or a preset that does not fit the dataset.json
    beside the reference folder, is an error; ``strict=False`` (``--allow-mismatch``) makes them
    warnings. Warnings go to ``echo`` (default: stderr).

    A prediction that is an nnU-Net trainer output folder (``TRAINER__PLANS__CONFIG`` with
    ``fold_N`` subfolders) is its cross-validation: every ``fold_N/validation`` prediction
    (``folds``: only those folds, and then only the cases they validated), see
    :mod:`nnunet_dro.evaluation.crossval`. ``reference=None`` is allowed then: the dataset's
    ``labelsTr`` under ``$nnUNet_raw``.
    """
    options = resolve_options(options, overrides, "evaluate")
    empty, missing, n_bootstrap = options.empty, options.missing, options.n_bootstrap
    strict, progress = options.strict, options.progress
    warn = options.echo or (lambda text: print(text, file=sys.stderr))
    if output is not None:
        reports.check_report_folder(output)
    reference, cross_validations, select_cases = _cross_validation_inputs(reference, predictions, options.folds)
    for cv in cross_validations.values():
        if options.folds is not None and splits_file(cv.folder) is None:
            # Without nnU-Net's splits nothing says which cases a fold validates: a fold still being
            # written would be scored on the cases it has so far.
            warn(f"note: {cv.name}: no {SPLITS_FILE} in the trainer folder or $nnUNet_preprocessed/"
                 f"{cv.folder.resolve().parent.name}, so nothing tells whether fold(s) {', '.join(map(str, cv.folds))} "
                 f"hold every case they validate; {cv.describe()}")
    inputs = check_inputs(reference, list(predictions), output, options.with_overrides(echo=warn),
                          select_cases=select_cases)
    metrics, percentiles, spec = inputs.metrics, inputs.percentiles, inputs.spec
    ref_files, assignment, num_processes = inputs.ref_files, inputs.assignment, inputs.num_processes
    cases = sorted(ref_files)
    methods = [_Method(name, path, "folder", files=cross_validations[name].files,
                       cross_validation=cross_validations[name]) if name in cross_validations
               else _load_method(name, path, metrics, spec.file_ending) for name, path in predictions.items()]
    case_report = _check_missing(methods, ref_files, missing, warn)
    for m in methods:
        if m.kind == "folder" and m.cross_validation is None and os.path.isdir(m.source) and \
                os.path.samefile(m.source, reference):
            # a typo or a sanity check: either way the reader must know the 100s are no result
            warn(f"warning: -pred {m.name}={m.source} is the reference folder itself: every case is scored "
                 f"against itself (Dice 100, HD95 0)")
    images = gallery_images(options.gallery, options.images, reference, cases, warn) if output is not None else None

    results = _read_cases(ref_files, methods, spec, metrics, inputs.nsd_tolerance, num_processes, progress)
    region_list = _resolve_regions(spec, results, methods)
    _check_labels(spec, results, ref_files, methods)
    _check_regions_present(region_list, results, empty, strict, warn)

    group_columns = assignment.column_names if assignment else []
    group_orders = assignment.order if assignment else {}
    scope = _Scope(tuple(methods), tuple(region_list), tuple(metrics), tuple(percentiles), tuple(group_columns),
                   group_orders, n_bootstrap, empty, missing)
    per_case = _score_cases(cases, results, assignment, scope)
    summary = _summarize(per_case, scope)
    comparison = _compare(per_case, scope) if len(methods) > 1 else None
    disparity = (disparity_table(per_case, [m.name for m in methods], [r.name for r in region_list], metrics,
                                 group_columns, group_orders, n_bootstrap) if group_columns else None)
    policy_columns = {"empty_policy": empty, "missing_policy": missing}
    for table in (per_case, summary, comparison, disparity):
        if table is not None:
            for column, value in policy_columns.items():
                table[column] = value
    if "note" in per_case:
        per_case["note"] = per_case.pop("note")  # last column, after the policies

    settings = _settings(reference, scope, inputs, options)
    if assignment is not None:
        case_report["groups"] = assignment.report()
    result = EvaluationResult(per_case=per_case, summary=summary, comparison=comparison, settings=settings,
                              cases=case_report, regions=region_list, group_columns=group_columns,
                              output_folder=output, disparity=disparity,
                              gallery=gallery_source(options.gallery, images, ref_files,
                                                     {m.name: m.files for m in methods}, region_list))
    if output is not None:
        reports.write_report(output, result)
    return result


def _cross_validation_inputs(reference: str | None, predictions: Mapping[str, str], folds: Sequence[int] | None):
    """(reference folder, cross-validation of each trainer-folder method, case selection or None)."""
    cross_validations = {name: gather_validation(name, path, folds) for name, path in predictions.items()
                         if is_trainer_folder(path)}
    check_same_folds(list(cross_validations.values()))
    for name, path in predictions.items():
        wrong = None if name in cross_validations else describe_non_trainer_folder(path)
        if wrong:
            raise UserError(f"-pred {name}={path}: {wrong}")
    if folds is not None and not cross_validations:
        raise UserError("--folds applies to nnU-Net trainer folders (TRAINER__PLANS__CONFIG with fold_N subfolders) "
                        "given to -pred, and none was given")
    if reference is None:
        if not cross_validations:
            raise UserError("-ref (the folder of reference segmentations) is required unless -pred names an nnU-Net "
                            "trainer folder (TRAINER__PLANS__CONFIG with fold_N/validation), whose dataset's labelsTr "
                            "under nnUNet_raw is the default")
        reference = str(dataset_labels_folder(list(cross_validations.values())))
    if not cross_validations:
        return reference, cross_validations, None

    def select_cases(ref_files: dict[str, str]) -> dict[str, str]:
        check_cases_in_reference(list(cross_validations.values()), reference, set(ref_files))
        if folds is None:
            return ref_files  # every fold: every case of the reference must be validated (--missing)
        covered = set().union(*(cv.files for cv in cross_validations.values()))
        return {case: path for case, path in ref_files.items() if case in covered}

    return reference, cross_validations, select_cases


def _check_method_names(method_names: Sequence[str]) -> None:
    if not method_names:
        raise UserError("give at least one prediction (-pred NAME=DIR)")
    for name in method_names:
        if not name or not name.strip():
            raise UserError("empty method name in -pred (use NAME=DIR)")


def _load_method(name: str, path: str, metrics: Sequence[str], file_ending: str | None) -> _Method:
    if os.path.isfile(path):
        if not path.lower().endswith(".json"):
            raise UserError(f"-pred {name}={path}: expected a folder or an nnU-Net summary.json")
        needs_masks = [m for m in metrics if m in MASK_METRICS]
        if needs_masks:
            shown = needs_masks[0].upper() if needs_masks[0] in ("hd95", "nsd") else f"{needs_masks[0]} error"
            raise UserError(f"-pred {name}={path}: an nnU-Net summary.json has no {shown} (it needs the masks: drop "
                            f"{needs_masks[0]} from --metrics or give the prediction folder)")
        return _Method(name, path, "summary", summary=load_nnunet_summary(path))
    return _Method(name, path, "folder", files=list_segmentations(path, f"prediction folder of {name}", file_ending))


class MissingPredictionError(UserError):
    """Reference cases without a prediction under ``--missing error``. ``problems`` is the message
    without the hint, so that a command with other options than evaluate's (``jtt``) can give its
    own instead of suggesting flags it does not have."""

    HINT = " (use --missing worst or --missing skip to go on)"

    def __init__(self, problems: str, offer_missing: bool = True):
        # --missing is offered for prediction folders only, never for unwritten validation files
        super().__init__(problems + (self.HINT if offer_missing else ""))
        self.problems = problems


def _check_missing(methods: list[_Method], ref_files: dict[str, str], missing: str, warn) -> dict:
    report = {"reference_cases": len(ref_files), "methods": {}}
    errors = []
    offer_missing = False  # --missing is offered for prediction folders only
    for m in methods:
        absent = sorted(set(ref_files) - m.cases)
        extra = sorted(m.cases - set(ref_files))
        report["methods"][m.name] = {"source": m.source, "missing_predictions": absent,
                                     "predictions_without_reference": extra,
                                     "evaluated_cases": len(ref_files) - (len(absent) if missing == "skip" else 0)}
        if m.cross_validation is not None:
            report["methods"][m.name]["folds"] = m.cross_validation.folds
            report["methods"][m.name]["fold_of_case"] = dict(sorted(m.cross_validation.fold_of_case.items()))
        _check_matching(m, ref_files, absent, extra)  # never --missing for files that are not predictions
        if extra:
            warn(f"note: {m.name}: {len(extra)} prediction(s) without reference ignored: {_short_list(extra)}")
        if not absent:
            continue
        if missing == "error":
            # A trainer folder lacking validation predictions has a fold not (fully) written:
            # --missing worst would score each unwritten case at Dice 0, and --folds would drop
            # them as if the fold were complete, so neither is offered for it.
            where = (f" in the validation of fold {', '.join(map(str, m.cross_validation.folds))} (is every fold "
                     f"finished? a fold's validation is written at the end of its training)"
                     if m.cross_validation is not None else "")
            offer_missing = offer_missing or m.cross_validation is None
            errors.append(f"{m.name} has no prediction for {len(absent)} case(s){where}: {_short_list(absent)}")
        elif missing == "worst":
            warn(f"note: {m.name}: {len(absent)} missing prediction(s) scored worst (--missing worst): "
                 f"{_short_list(absent)}")
        else:
            warn(f"note: {m.name}: {len(absent)} case(s) without prediction skipped (--missing skip): "
                 f"{_short_list(absent)}")
    if errors:
        raise MissingPredictionError("; ".join(errors), offer_missing)
    return report


CHANNEL_SUFFIX = re.compile(r"_\d{4}$")  # nnU-Net's input image naming: CASE_0000.nii.gz


def _misnamed(absent: Sequence[str], extra: Sequence[str]) -> list[tuple[str, str]]:
    """(file's case identifier, reference case) pairs where a file without reference looks like a
    reference case under another name: an nnU-Net input image (``case_001_0000``), another case
    (``Case_001``), a prefix or suffix (``pred_case_001``).

    >>> _misnamed(["case_001", "case_002", "c_1"], ["case_001_0000", "x", "PRED_case_002", "c_10"])
    [('case_001_0000', 'case_001'), ('PRED_case_002', 'case_002')]
    """
    lowered = {case.lower(): case for case in absent}
    pairs = []
    for name in extra:
        key = CHANNEL_SUFFIX.sub("", name).lower()
        match = lowered.get(key) or next((case for low, case in lowered.items()
                                          if re.search(rf"(?<![0-9a-z]){re.escape(low)}(?![0-9a-z])", name.lower())),
                                         None)
        if match is not None:
            pairs.append((name, match))
    return pairs


def _check_matching(m: _Method, ref_files: dict[str, str], absent: list[str], extra: list[str]) -> None:
    """Predictions that match no reference case, or files named like a reference case under
    another name, are an error whatever ``--missing`` says: scoring them as missing would report
    Dice 0 for a method that was never evaluated (or leave it with n = 0)."""
    looks_like_images = [name for name in extra if CHANNEL_SUFFIX.search(name)]
    what = ("; they look like nnU-Net input images (CASE_0000), not predictions" if looks_like_images
            and len(looks_like_images) == len(extra) else "")
    if not set(ref_files) & m.cases:
        raise UserError(f"-pred {m.name}={m.source}: none of its {len(m.cases)} file(s) matches a reference case "
                        f"(its cases: {_short_list(sorted(m.cases), 3)}; reference cases: "
                        f"{_short_list(sorted(ref_files), 3)}){what}; predictions are named like the references "
                        f"(CASE.nii.gz)")
    pairs = _misnamed(absent, extra)
    if pairs:
        shown = ", ".join(f"{name} for {case}" for name, case in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
        raise UserError(f"-pred {m.name}={m.source}: {len(pairs)} file(s) look like predictions of reference cases "
                        f"under another name ({shown}){what}; rename them as the references are named")


def _warn_group_report(assignment: GroupAssignment, path: str, warn) -> None:
    if assignment.cases_not_in_table:  # only with --groups-partial: else an error
        warn(f"warning: {len(assignment.cases_not_in_table)} case(s) missing from group table {path} form the "
             f"group {NOT_IN_TABLE!r} of every group column (--groups-partial): "
             f"{_short_list(assignment.cases_not_in_table)}")
    if assignment.rows_without_reference:
        warn(f"note: {len(assignment.rows_without_reference)} row(s) of group table {path} have no reference "
             f"file: {_short_list(assignment.rows_without_reference)}")
    for column in assignment.skipped_continuous_columns:
        if column == "split":
            warn(f"note: column 'split' of {path} (the dataset's train/test split) is not grouped by default; "
                 f"name it in --group-by to stratify by it")
        else:
            warn(f"note: column {column!r} of {path} is numeric, not grouped by default (whatever the number of "
                 f"cases); bin it with --group-by {column}:EDGES (e.g. {column}:20,25,30), or name it in "
                 f"--group-by to group by each value")
    for column, without in assignment.cases_without_value.items():
        read_as = assignment.missing_markers.get(column)
        marked = f" ({', '.join(map(repr, read_as))} read as no value)" if read_as else ""
        warn(f"note: {len(without)} case(s) have no value in column {column!r}{marked}, counted in 'all' only: "
             f"{_short_list(without)}")


def _short_list(items: Sequence[str], limit: int = 8) -> str:
    return ", ".join(items[:limit]) + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def _read_cases(ref_files, methods, spec: RegionSpec, metrics, nsd_tolerance: float, num_processes: int,
                progress: bool) -> dict[str, CaseResult]:
    folder_methods = [m for m in methods if m.kind == "folder"]
    if not folder_methods:
        return {}  # summary.json input only: no image is read
    hd95_regions = None if spec.regions is None else tuple(r.labels for r in spec.regions)
    tasks = [CaseTask(case=case, reference=path,
                      predictions=tuple((m.name, m.files[case]) for m in folder_methods if case in m.files),
                      ignore_label=spec.ignore_label, compute_hd95="hd95" in metrics, hd95_regions=hd95_regions,
                      compute_nsd="nsd" in metrics, nsd_tolerance_mm=nsd_tolerance,
                      compute_topology=any(m in TOPOLOGY_METRICS for m in metrics))
             for case, path in sorted(ref_files.items())]
    from tqdm import tqdm

    bar = tqdm(total=len(tasks), desc="Reading cases", unit="case", file=sys.stderr, disable=not progress,
               leave=False)
    results: dict[str, CaseResult] = {}
    try:
        workers = min(num_processes, len(tasks))
        if workers <= 1:
            for task in tasks:
                results[task.case] = evaluate_case(task)
                bar.update()
        else:
            from nnunet_dro.evaluation.workers import read_cases_in_pool

            results = read_cases_in_pool(tasks, workers, on_result=lambda result: bar.update())
    finally:
        bar.close()
    return results


def _resolve_regions(spec: RegionSpec, results: dict[str, CaseResult], methods: list[_Method]) -> list[Region]:
    if spec.regions is not None:
        return list(spec.regions)
    if results:
        found = set()
        for r in results.values():
            found |= _reference_labels(r)
        regions = default_regions(found)
        if not regions:
            raise UserError("the reference folder has no foreground label in any case; give the regions with -regions")
        return list(regions)
    # summary.json input only: the labels/regions nnU-Net evaluated, in the first method's order
    first = next(iter(methods[0].summary.values()))
    return [Region("+".join(str(v) for v in sorted(key)), tuple(sorted(key))) for key in first if 0 not in key]


def _reference_labels(result: CaseResult) -> set[int]:
    return set(result.reference_labels)


def _check_regions_present(regions: list[Region], results: dict[str, CaseResult], empty: str, strict: bool,
                           warn) -> None:
    """A region none of whose labels occurs in any reference file is almost always a wrong
    ``-regions`` (a typo, another label convention): say so instead of scoring it silently."""
    if not results:
        return  # summary.json input only: the references were not read
    found = set()
    for r in results.values():
        found |= _reference_labels(r)
    absent = [r for r in regions if not found & set(r.labels)]
    if not absent:
        return
    listed = "; ".join(f"{r.name} (label{'s' if len(r.labels) > 1 else ''} "
                       f"{','.join(map(str, r.labels))})" for r in absent)
    what = (f"region{'s' if len(absent) > 1 else ''} {listed} occur{'' if len(absent) > 1 else 's'} in no "
            f"reference file (labels found: {','.join(map(str, sorted(found - {0}))) or 'none'})")
    if strict:
        raise UserError(f"{what}; check -regions (or pass --allow-mismatch to go on with a warning)")
    scored = ("scores Dice 100 wherever the prediction is empty too (--empty one)" if empty == "one"
              else "is left out wherever the prediction is empty too (--empty nan)")
    warn(f"warning: {what}; such a region {scored}. Check -regions (going on: --allow-mismatch)")


def _check_labels(spec: RegionSpec, results: dict[str, CaseResult], ref_files: dict[str, str],
                  methods: list[_Method]) -> None:
    """Every label value must be declared (preset/dataset.json) or, for default and inline regions,
    be background, a label named in -regions, or a label found in the references."""
    if spec.declared_labels is not None:
        declared, how = set(spec.declared_labels), f"declared by {spec.source}"
    else:
        declared = {0} | set(spec.extra_labels)
        for r in results.values():
            declared |= _reference_labels(r)
        how = "found in the reference folder" + (" or named in -regions" if spec.extra_labels else "")
    if spec.ignore_label is not None:
        declared.add(spec.ignore_label)
    files = {m.name: m.files for m in methods if m.kind == "folder"}
    for case in sorted(results):
        in_ref = set(results[case].reference_labels)
        if in_ref - declared:
            raise UserError(f"case {case!r}: label value {min(in_ref - declared)} in {ref_files[case]} is "
                            f"not among the labels {how} {sorted(declared)}")
        for name, r in results[case].methods.items():
            in_pred = {int(v) for v, n in zip(r.labels, r.table.sum(axis=0)) if n > 0}
            if in_pred - declared:
                raise UserError(f"case {case!r}: label value {min(in_pred - declared)} in {files[name][case]} "
                                f"(method {name}) is not among the labels {how} {sorted(declared)}")


def _score_cases(cases, results, assignment: GroupAssignment | None, scope: _Scope) -> pd.DataFrame:
    methods, regions, metrics, empty, missing = scope.methods, scope.regions, scope.metrics, scope.empty, scope.missing
    rows = []
    for m in methods:
        for case in cases:
            present = case in m.cases
            if not present and missing == "skip":
                continue
            for region in regions:
                for metric, value, note in _case_scores(m, case, present, region, metrics, empty, results):
                    rows.append((m.name, case, region.name, metric, value, note))
    per_case = pd.DataFrame(rows, columns=["method", "case", "region", "metric", "value", "note"])
    if assignment is not None:
        position = 5
        for column in assignment.column_names:
            per_case.insert(position, column, per_case["case"].map(assignment.labels[column]))
            position += 1
    return per_case


def _case_scores(m: _Method, case: str, present: bool, region: Region, metrics, empty, results):
    geometry = results[case].geometry if case in results else None
    if not present:  # --missing worst
        note = "prediction missing: scored worst (--missing worst)"
        errors = None
        if any(metric in TOPOLOGY_METRICS for metric in metrics):
            # scored as an empty prediction: a topology error has no worst value of its own
            reference = results[case].reference_topology.get(region.labels, (0, 0, 0, 0))
            errors = topology_errors(reference, (0, 0, 0, 0))
        for metric in metrics:
            if metric == "hd95":
                yield metric, geometry.diagonal_mm, note
            elif metric in TOPOLOGY_METRICS:
                yield metric, errors[metric], note + ": topology as an empty prediction"
            else:
                yield metric, 0.0, note
        return
    if m.kind == "summary":
        yield from _summary_scores(m, case, region, metrics, empty)
        return
    r = results[case].methods[m.name]
    n_ref, n_pred, tp = region_counts(r.labels, r.table, region.labels)
    both_empty = n_ref + n_pred == 0
    for metric in metrics:
        note = _empty_note(empty) if both_empty else ""
        if metric == "dice":
            value = dice_percent(n_ref, n_pred, tp, empty)
        elif metric == "vs":
            value = volume_similarity_percent(n_ref, n_pred, empty)
        elif metric == "nsd":
            if both_empty:
                value = 100.0 if empty == "one" else float("nan")
            elif n_ref == 0 or n_pred == 0:
                value, note = 0.0, "one side empty: NSD 0"
            else:
                value = r.nsd[region.labels]
        elif metric in TOPOLOGY_METRICS:
            if both_empty:
                value = 0.0 if empty == "one" else float("nan")
            else:
                reference = results[case].reference_topology[region.labels]
                value = topology_errors(reference, r.topology[region.labels])[metric]
        else:
            value = hd95_empty_value(n_ref, n_pred, geometry, empty)
            if value is None:
                value = r.hd95[region.labels]
            elif not both_empty:
                note = "one side empty: HD95 scored as the image diagonal"
        if both_empty:
            note = _empty_note(empty, value)  # the value given, not always 100: HD95 and topology get 0
        yield metric, value, note


def _empty_note(empty: str, value: float = 100.0) -> str:
    return (f"empty in reference and prediction: scored {value:g} (--empty one)" if empty == "one"
            else "empty in reference and prediction: left out (--empty nan)")


def _summary_scores(m: _Method, case: str, region: Region, metrics, empty):
    entry = m.summary[case].get(frozenset(region.labels))
    if entry is None:
        keys = ", ".join("+".join(str(v) for v in sorted(k)) for k in m.summary[case])
        raise UserError(f"{m.source}: case {case!r} has no result for region {region.name} "
                        f"(labels {'+'.join(map(str, region.labels))}); it has: {keys}")
    both_empty = np.isnan(entry.dice)  # nnU-Net's Dice is NaN exactly when TP + FP + FN == 0
    note = _empty_note(empty) if both_empty else ""
    for metric in metrics:
        if metric == "dice":
            value = (100.0 if empty == "one" else float("nan")) if both_empty else 100.0 * entry.dice
        else:  # vs, from nnU-Net's voxel counts
            if entry.n_ref is None or entry.n_pred is None:
                raise UserError(f"{m.source}: no n_ref/n_pred voxel counts, cannot compute vs")
            value = volume_similarity_percent(int(entry.n_ref), int(entry.n_pred), empty)
        yield metric, value, note


def _summarize(per_case, scope: _Scope) -> pd.DataFrame:
    """Statistics per method, group, region and metric (tails by the metric's direction).

    ``same_cases``: whether every method was scored on the same cases in that group and region
    (not so under ``--missing skip`` with a missing prediction, or ``--empty nan`` where only some
    methods left a region empty): only then does a report mark a winner.
    """
    methods, regions, metrics, percentiles = scope.methods, scope.regions, scope.metrics, scope.percentiles
    group_columns, group_orders, n_bootstrap = scope.group_columns, scope.group_orders, scope.n_bootstrap
    rows = []
    scored: dict[tuple, set] = {}  # (metric, group_column, group, region) -> the case sets of the methods
    indexed = {key: frame for key, frame in per_case.groupby(["metric", "method", "region"], sort=False)}
    for metric in metrics:
        higher = METRIC_INFO[metric].higher_is_better
        for group_column, group, column in groupings(group_columns, group_orders):
            for m in methods:
                for region in regions:
                    frame = indexed.get((metric, m.name, region.name))
                    if frame is not None and column is not None:
                        frame = frame[frame[column] == group]
                    if frame is None:
                        values, cases = np.array([]), frozenset()
                    else:
                        values = frame["value"].to_numpy(float)
                        cases = frozenset(frame["case"].to_numpy()[~np.isnan(values)])
                    key = (metric, group_column, group, region.name)
                    scored.setdefault(key, set()).add(cases)
                    row = {"method": m.name, "group_column": group_column, "group": group,
                           "region": region.name, "metric": metric,
                           "direction": "higher is better" if higher else "lower is better",
                           **summarize(values, percentiles, higher)}
                    if n_bootstrap > 0:
                        for name, (low, high) in bootstrap_summary_intervals(values, higher, n_bootstrap).items():
                            row[f"{name}_ci_low"], row[f"{name}_ci_high"] = low, high
                    rows.append(row)
    for row in rows:
        row["same_cases"] = len(scored[(row["metric"], row["group_column"], row["group"], row["region"])]) == 1
    columns = ["method", "group_column", "group", "region", "metric", "n", "mean", "std", "median", "iqr"] + \
        [percentile_column(q) for q in percentiles] + [CVAR_COLUMN]
    if n_bootstrap > 0:
        columns += ["mean_ci_low", "mean_ci_high", f"{CVAR_COLUMN}_ci_low", f"{CVAR_COLUMN}_ci_high"]
    columns += ["direction", "same_cases"]
    return pd.DataFrame(rows, columns=columns)


def _compare(per_case, scope: _Scope) -> pd.DataFrame:
    """Paired comparison of each method against the first, per group, region and metric.

    Holm's adjustment runs over all comparisons of the same metric (every method, group and region).
    """
    methods, regions, metrics, percentiles = scope.methods, scope.regions, scope.metrics, scope.percentiles
    group_columns, group_orders, n_bootstrap = scope.group_columns, scope.group_orders, scope.n_bootstrap
    base = methods[0].name
    rows = []
    for metric in metrics:
        higher = METRIC_INFO[metric].higher_is_better
        family_start = len(rows)
        for group_column, group, column in groupings(group_columns, group_orders):
            frame = per_case[per_case["metric"] == metric]
            if column is not None:
                frame = frame[frame[column] == group]
            for region in regions:
                wide = frame[frame["region"] == region.name].pivot(index="case", columns="method", values="value")
                for m in methods[1:]:
                    if m.name in wide and base in wide:
                        a, b = wide[m.name].to_numpy(float), wide[base].to_numpy(float)
                    else:
                        a = b = np.array([])
                    keep = ~(np.isnan(a) | np.isnan(b))
                    n_pairs = int(keep.sum())
                    row = {"method": m.name, "reference_method": base, "group_column": group_column,
                           "group": group, "region": region.name, "metric": metric, "n_pairs": n_pairs,
                           "mean_difference": float(np.mean(a[keep] - b[keep])) if keep.any() else np.nan,
                           "wilcoxon_p": paired_wilcoxon(a, b), "holm_p": np.nan,
                           "wilcoxon_note": "" if wilcoxon_can_reach(n_pairs) else
                           f"n = {n_pairs}: too few for p < 0.05"}
                    if n_bootstrap > 0:
                        row["mean_difference_ci_low"], row["mean_difference_ci_high"] = \
                            bootstrap_mean_difference(a, b, n_bootstrap)
                    for q in percentiles:  # the worst q % of each method, by the metric's direction
                        t = tail_quantile(q, higher)
                        row[f"{percentile_column(q)}_difference"] = (
                            float(np.percentile(a[keep], t) - np.percentile(b[keep], t)) if keep.any() else np.nan)
                    if n_bootstrap > 0:
                        intervals = bootstrap_percentile_difference(a, b, percentiles, n_bootstrap,
                                                                    higher_is_better=higher)
                        for q, (low, high) in intervals.items():
                            row[f"{percentile_column(q)}_difference_ci_low"] = low
                            row[f"{percentile_column(q)}_difference_ci_high"] = high
                    row[f"{CVAR_COLUMN}_difference"] = (cvar(a[keep], higher) - cvar(b[keep], higher)
                                                        if keep.any() else np.nan)
                    if n_bootstrap > 0:
                        row[f"{CVAR_COLUMN}_difference_ci_low"], row[f"{CVAR_COLUMN}_difference_ci_high"] = \
                            bootstrap_cvar_difference(a, b, higher, n_bootstrap)
                    rows.append(row)
        adjusted = holm([r["wilcoxon_p"] for r in rows[family_start:]])
        for r, p in zip(rows[family_start:], adjusted):
            r["holm_p"] = p
    return pd.DataFrame(rows)


def _settings(reference, scope: _Scope, inputs: _Inputs, options: EvaluationOptions) -> dict:
    """``summary.json``'s settings: what was scored (``scope``), how the inputs were read (``inputs``:
    region spec, processes, NSD tolerance) and the group table of ``options``."""
    import importlib.metadata as md

    methods, regions, metrics, percentiles = scope.methods, scope.regions, scope.metrics, scope.percentiles
    empty, missing, spec = scope.empty, scope.missing, inputs.spec
    groups, case_column, group_by = options.groups, options.case_column, options.group_by

    def version(package):
        try:
            return md.version(package)
        except md.PackageNotFoundError:
            return None

    return {
        "reference": os.path.abspath(reference),
        "predictions": {m.name: os.path.abspath(m.source) for m in methods},
        "prediction_kinds": {m.name: "cross-validation" if m.cross_validation else m.kind for m in methods},
        "cross_validation": {m.name: {"folder": os.path.abspath(m.source), "folds": m.cross_validation.folds,
                                      "cases": len(m.cross_validation.files),
                                      "text": m.cross_validation.describe()}
                             for m in methods if m.cross_validation is not None} or None,
        "regions": {r.name: list(r.labels) for r in regions},
        "region_spec": spec.as_json(),
        "metrics": list(metrics),
        "units": {m: METRIC_INFO[m].unit for m in metrics},
        "directions": {m: "higher is better" if METRIC_INFO[m].higher_is_better else "lower is better"
                       for m in metrics},
        "nsd_tolerance_mm": inputs.nsd_tolerance if "nsd" in metrics else None,
        "nsd": NSD_TEXT,
        "topology": TOPOLOGY_TEXT,
        "percentiles": list(percentiles),
        "empty_policy": empty,
        "empty_policy_text": EMPTY_POLICY_TEXT[empty],
        "missing_policy": missing,
        "missing_policy_text": MISSING_POLICY_TEXT[missing],
        "hd95": HD95_TEXT,
        "statistics": {"percentiles": "numpy.percentile, linear interpolation (numpy default)",
                       "tails": TAIL_TEXT,
                       "bold": "best mean, median, pXX and cvar10 per group and region by the metric's direction, "
                               "only where every method was scored on the same cases (same_cases); never n, std "
                               "or iqr",
                       "disparity": "per group column and region: best and worst group mean, gap = how much better "
                                    "the best group is (max - min of the group means), ratio = min / max, "
                                    "equity_scaled = 100 * o / (1 + sum |m_g - o|) on the 0-1 scale (Dice, NSD, VS); "
                                    "gap_change = gap(method) - gap(first method) on the cases both scored; "
                                    "intervals: percentile bootstrap resampling cases within each group",
                       "iqr": "p75 - p25", "std": "sample standard deviation (ddof=1)",
                       "nan": "NaN scores (--empty nan) are left out; n counts the values used",
                       "comparison": "mean paired difference (method - reference_method) on cases scored by "
                                     "both; two-sided Wilcoxon signed-rank test (scipy); Holm adjustment over "
                                     "all comparisons of the same metric; with 5 pairs or fewer the exact test "
                                     "cannot reach p < 0.05 (wilcoxon_note)",
                       "bootstrap": "case-resampling percentile bootstrap (pairs kept together), 95% intervals of "
                                    "the mean, cvar10 and their paired differences, the percentile differences and "
                                    "the disparity statistics (within groups), seed 0; it does not measure "
                                    "run-to-run variance"},
        "group_table": os.path.abspath(groups) if groups else None,
        "case_column": case_column,
        "group_by": list(group_by) if group_by else None,
        "n_bootstrap": scope.n_bootstrap,
        "num_processes": inputs.num_processes,
        "versions": {p: version(p) for p in ("nnunet_dro", "nnunetv2", "numpy", "scipy", "pandas", "SimpleITK",
                                             "nibabel")},
    }
