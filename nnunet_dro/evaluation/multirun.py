"""``evaluate_runs(...)``: evaluate several training runs per method (``-pred ERM=r1,r2,r3 DRO=a,b,c``).

Every run folder is evaluated as a method of its own, named ``METHOD#k`` (k from 1, in the order
given) in ``per_case.csv``, ``summary.csv`` and the per-run tables of ``table.md``; the statistics
over runs (:mod:`~nnunet_dro.evaluation.runs`) go to ``runs.csv``, ``runs.json`` and the section
"Several trainings per method" of ``table.md``. The paired comparison of single runs
(``comparison.csv``, against the first run of the first method) is not written: the differences
over runs replace it. Each run folder follows the same rules as a single one (``--missing``,
cross-validation trainer folders, ``--folds``).

Example (Python)::

    from nnunet_dro.evaluation.multirun import evaluate_runs
    result = evaluate_runs("labelsTs", {"ERM": ["erm_s0", "erm_s1", "erm_s2"],
                                        "DRO": ["dro_s0", "dro_s1", "dro_s2"]}, "report", paired=True)
    result.runs.table.query("kind == 'difference' and statistic == 'p10'")
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Sequence

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation import api, reports
from nnunet_dro.evaluation.options import EvaluationOptions, resolve_options
from nnunet_dro.evaluation.result import EvaluationResult
from nnunet_dro.evaluation.runs import RUN_SEPARATOR, RunsReport, RunsTableScope, explanation, run_label, runs_table

DEFAULT_RUN_RESAMPLES = 2000


def check_runs(predictions: Mapping[str, Sequence[str]], paired: bool) -> None:
    """One-line UserError for run lists that cannot be evaluated as asked."""
    seen: dict[str, str] = {}
    for name, folders in predictions.items():
        if RUN_SEPARATOR in name:
            raise UserError(f"-pred {name}: a method name with several runs cannot contain {RUN_SEPARATOR!r} "
                            f"(runs are named {run_label(name, 1)}, ...)")
        if not folders or any(not str(f).strip() for f in folders):
            raise UserError(f"-pred {name}={','.join(map(str, folders))}: an empty run folder name (two commas, "
                            f"or one at the end?)")
        for k, folder in enumerate(folders, 1):
            key = os.path.realpath(folder)
            where = f"{name} run {k}"
            if key in seen:
                raise UserError(f"-pred: {folder} is given twice ({seen[key]} and {where}); each run needs its own "
                                f"folder")
            seen[key] = where
    if paired:
        counts = {name: len(folders) for name, folders in predictions.items()}
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"{name} {n}" for name, n in counts.items())
            raise UserError(f"--paired-runs: every method needs the same number of runs, one per seed, in seed "
                            f"order (given: {listed})")
        if min(counts.values()) < 2:
            raise UserError("--paired-runs: each method has one run; give two or more per method "
                            "(-pred NAME=RUN1,RUN2,...), one per seed")


def evaluate_runs(reference: str | None, predictions: Mapping[str, Sequence[str]], output: str | None,
                  options: EvaluationOptions | None = None, *, paired: bool = False, **overrides) -> EvaluationResult:
    """Evaluate ``predictions`` (method -> its run folders) against ``reference``.

    ``paired``: the k-th run of every method shares seed k (data split, initial weights).
    ``options`` and the keyword ``overrides`` are those of :func:`nnunet_dro.evaluation.api.evaluate`,
    except ``n_bootstrap``: here the resamples of the intervals over runs and over test cases
    (0: 2000); the single runs are evaluated without bootstrap.
    """
    options = resolve_options(options, overrides, "evaluate_runs")
    predictions = {name: [str(f) for f in folders] for name, folders in predictions.items()}
    check_runs(predictions, paired)
    if output is not None:
        reports.check_report_folder(output)
    labels = {name: [run_label(name, k) for k in range(1, len(folders) + 1)] for name, folders in predictions.items()}
    flat = {label: folder for name, folders in predictions.items() for label, folder in zip(labels[name], folders)}
    try:
        result = api.evaluate(reference, flat, None, options.with_overrides(n_bootstrap=0))
    except UserError as error:  # name the folder of each run the message speaks of
        named = [f"{label} = {folder}" for label, folder in flat.items()
                 if re.search(rf"(?<![\w#]){re.escape(label)}(?![\w#])", str(error))]
        if not named:
            raise
        raise UserError(f"{error} ({'; '.join(named)})") from None
    resamples = options.n_bootstrap or DEFAULT_RUN_RESAMPLES
    settings = result.settings
    scope = RunsTableScope([r.name for r in result.regions], settings["metrics"], settings["percentiles"],
                           result.group_columns,
                           {c: list(result.summary.loc[result.summary["group_column"] == c, "group"].drop_duplicates())
                            for c in result.group_columns})
    table = runs_table(result.per_case, labels, scope, paired=paired, n_bootstrap=resamples)
    runs_settings = {"paired": paired, "runs": {name: [os.path.abspath(f) for f in folders]
                                                for name, folders in predictions.items()},
                     "run_names": labels, "n_bootstrap": resamples, "confidence": 0.95, "bootstrap_seed": 0,
                     "explanation": explanation(paired, resamples)}
    settings["runs"] = runs_settings
    settings["n_bootstrap"] = resamples
    result.comparison = None
    result.runs = RunsReport(table, runs_settings)
    result.output_folder = output
    if output is not None:
        reports.write_report(output, result)
    return result
