"""Just Train Twice (Liu et al., "Just Train Twice: Improving Group Robustness without Training
Group Information", ICML 2021, arXiv:2107.09044) for nnU-Net: the case-weight table of its second
training, from a finished first (ERM) training.

JTT is label-free like DRO, but in two trainings instead of one: train ERM, take the training cases
it fits worst (the *error set*), and train again with those cases drawn ``upweight`` times as often.
Here the first training's per-case Dice on its training cases comes from its cross-validation (each
case predicted by the fold that did not train on it: ``-pred TRAINER__PLANS__CONFIG``) or from any
folder of predictions of the training images; the second training is ``nnUNetTrainerCaseWeights``
reading the table written here (``case_weights.tsv``, found as
:mod:`nnunet_dro.training.case_tables` describes).

Rules for the error set (``rule``), applied to the cases' Dice over the regions evaluated:

- ``worst-dice`` (default): a case's lowest region Dice; the ``fraction`` of cases with the lowest
  values (a case that misses one structure entirely is in it, however well it fits the others);
- ``mean-dice``: a case's mean region Dice (the Dice part of nnU-Net's loss, averaged).

Ties at the boundary: every case whose score equals the score of the last case within
``ceil(fraction * n)`` is in the error set, so the set can be larger than the fraction asks, and
the command says so (which cases tie, how many more). Breaking the tie by case identifier (as
before) was reproducible but arbitrary: of three cases at Dice 0, two were upweighted and one not,
for nothing but their names.

The cases weighted must be training cases: predictions of test cases (``-ref labelsTs``, or a
reference folder holding cases the dataset's ``labelsTr`` lacks) are refused, since a weight for a
case the second training never draws is no JTT, and upweighting test cases would leak them.

>>> import pandas as pd
>>> per_case = pd.DataFrame({"case": ["a", "a", "b", "b", "c", "c"], "region": ["x", "y"] * 3,
...                          "value": [90.0, 10.0, 60.0, 60.0, 95.0, 96.0]})
>>> error_set(per_case, fraction=1 / 3, rule="worst-dice"), error_set(per_case, fraction=1 / 3, rule="mean-dice")
(['a'], ['a'])
>>> case_weight_table(["a", "b", "c"], ["a"], upweight=5.0)["weight"].tolist()
[5.0, 1.0, 1.0]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from nnunet_dro.atomic import write_text_atomic
from nnunet_dro.errors import UserError
from nnunet_dro.weighting.error_set import TIE_TOLERANCE, choose_error_set  # noqa: F401 (TIE_TOLERANCE: re-exported)

RULES = ("worst-dice", "mean-dice")


def case_scores(per_case: pd.DataFrame, rule: str) -> pd.Series:
    """Per case, the score the rule ranks by (lower: fitted worse), from an evaluation's per-case
    Dice table (columns ``case``, ``region``, ``value``; NaN regions left out)."""
    if rule not in RULES:
        raise UserError(f"--rule {rule!r}: choose one of {', '.join(RULES)}")
    grouped = per_case.dropna(subset=["value"]).groupby("case")["value"]
    return (grouped.min() if rule == "worst-dice" else grouped.mean()).sort_index()


def error_set(per_case: pd.DataFrame, fraction: float, rule: str = "worst-dice") -> list[str]:
    """The ``ceil(fraction * n)`` cases with the lowest :func:`case_scores`, and every case tied
    with the last of them (see the module docstring; :func:`boundary_ties` names them)."""
    return sorted(_error_set_and_ties(per_case, fraction, rule)[0])


def boundary_ties(per_case: pd.DataFrame, fraction: float, rule: str = "worst-dice") -> tuple[list[str], int]:
    """The cases tied at the error set's boundary score (empty if no tie crosses it) and
    ``ceil(fraction * n)``, the size the fraction asked for.

    >>> per_case = pd.DataFrame({"case": ["a", "b", "c", "d"], "region": ["x"] * 4, "value": [0.0, 0.0, 0.0, 80.0]})
    >>> error_set(per_case, 0.5), boundary_ties(per_case, 0.5)
    (['a', 'b', 'c'], (['a', 'b', 'c'], 2))
    """
    _, ties, asked = _error_set_and_ties(per_case, fraction, rule)
    return ties, asked


def _error_set_and_ties(per_case: pd.DataFrame, fraction: float, rule: str):
    if not (0.0 < fraction < 1.0):
        raise UserError(f"--fraction {fraction}: must lie strictly between 0 and 1")
    scores = case_scores(per_case, rule)
    if scores.empty:
        raise UserError("no case has a Dice to rank: the evaluation scored nothing")
    # the one rule of the error set, shared with the trainer that chooses it inside one training
    choice = choose_error_set(scores, fraction, worst="lowest", what=rule,
                              why="the first training's scores do not separate the cases")
    return list(choice.cases), list(choice.tied), choice.asked


def case_weight_table(cases: Sequence[str], errors: Sequence[str], upweight: float) -> pd.DataFrame:
    """``case``/``weight`` rows: ``upweight`` for the error set, 1 for the other cases."""
    if not (math.isfinite(upweight) and upweight >= 1.0):
        raise UserError(f"--upweight {upweight}: must be a finite number >= 1")
    chosen = set(errors)
    return pd.DataFrame({"case": sorted(cases), "weight": [float(upweight) if c in chosen else 1.0
                                                            for c in sorted(cases)]})


def jtt_table(per_case: pd.DataFrame, fraction: float, rule: str, upweight: float) -> tuple[pd.DataFrame, list[str]]:
    """The case-weight table (``case``, ``weight``, and each case's ``score`` by ``rule``) and the
    error set, from the first training's per-case Dice (columns ``case``, ``region``, ``value``)."""
    errors = error_set(per_case, fraction, rule)
    scores = case_scores(per_case, rule)
    table = case_weight_table(list(scores.index), errors, upweight)
    table["score"] = table["case"].map(scores).round(3)
    return table, errors


@dataclass(frozen=True)
class JttOptions:
    """How :func:`write_jtt_table` scores the first training and chooses the error set.

    ``fraction``, ``rule``, ``upweight``: the error set (the worst ``fraction`` of the training
    cases by ``rule``, drawn ``upweight`` times as often); ``regions``, ``folds``,
    ``num_processes``: as ``nnunet_dro evaluate`` reads the first training; ``echo``: where the
    notes go; ``name``: the first training's name in messages (default: its folder's name);
    ``progress``: a progress bar on stderr while cases are read.

    >>> replace(JttOptions(), fraction=0.1).fraction
    0.1
    """

    fraction: float = 0.2
    rule: str = "worst-dice"
    upweight: float = 5.0
    regions: str | None = None
    folds: Sequence[int] | None = None
    num_processes: int | None = None
    echo: Callable[[str], None] = print
    name: str | None = None
    progress: bool = False


def write_jtt_table(prediction: str, output: str | Path, *, reference: str | None = None,
                    options: JttOptions | None = None, **overrides: Any) -> pd.DataFrame:
    """Evaluate the first training (a trainer output folder for its cross-validation, or a
    prediction folder with ``reference``), choose the error set, write ``output`` atomically and
    return the table (with each case's score). ``options`` (:class:`JttOptions`; None: its
    defaults) says how; a keyword of :class:`JttOptions` replaces that field (an unknown one is a
    TypeError): ``write_jtt_table(folder, "case_weights.tsv", fraction=0.1)``."""
    o = replace(options or JttOptions(), **overrides)
    fraction, rule, upweight, echo = o.fraction, o.rule, o.upweight, o.echo
    from nnunet_dro.evaluation.api import MissingPredictionError, evaluate

    output = Path(output)
    if output.suffix != ".tsv":
        raise UserError(f"-o {output}: the case-weight table is tab-separated; name it case_weights.tsv")
    if not output.parent.is_dir():
        raise UserError(f"-o {output}: folder {output.parent} does not exist")
    if reference is not None:
        _check_training_reference(reference)
    name = o.name or Path(prediction).name or "first training"
    try:
        result = evaluate(reference, {name: prediction}, None, regions=o.regions, num_processes=o.num_processes,
                          progress=o.progress, folds=o.folds, echo=echo)
    except MissingPredictionError as error:
        # jtt has no --missing: a case the first training never predicted has no error to rank, and a
        # Dice of 0 invented for it would put it in the error set
        problems = error.problems.replace(" (evaluate these folds' cases only with --folds)", "")  # refused below
        raise UserError(f"{problems} (JTT ranks every training case by the first training's error: write "
                        f"the missing predictions first, e.g. nnUNetv2_train DATASET CONFIG FOLD --val with the "
                        f"first training's -tr)") from None
    _check_training_cases(result.settings["reference"], sorted(set(result.per_case["case"])), o.folds)
    per_case = result.per_case[result.per_case["metric"] == "dice"]
    table, errors = jtt_table(per_case, fraction, rule, upweight)
    ties, asked = boundary_ties(per_case, fraction, rule)
    write_text_atomic(output, table.to_csv(sep="\t", index=False))
    if ties:
        boundary = table.loc[table["case"] == ties[0], "score"].iloc[0]
        echo(f"note: {len(ties)} cases tie at the boundary score {boundary:g} ({', '.join(ties[:8])}"
             f"{' ...' if len(ties) > 8 else ''}): all are in the error set, {len(errors)} cases instead of the "
             f"{asked} that --fraction {fraction:g} asks for")
    echo(f"error set ({rule}, worst {fraction:g}): {len(errors)} of {len(table)} cases, drawn {upweight:g} times as "
         f"often: {', '.join(errors[:8])}{' ...' if len(errors) > 8 else ''}")
    echo(f"written: {output} (train with: nnUNetv2_train DATASET CONFIG FOLD -tr nnUNetTrainerCaseWeights; the "
         f"table is read from nnUNet_preprocessed/DatasetXXX_Name/ or $nnUNet_dro_case_weights)")
    return table


def _check_training_reference(reference: str | Path) -> None:
    """``-ref`` must hold the training cases: a dataset's ``labelsTs`` (or any folder beside a
    ``labelsTr`` that is not it) holds test cases."""
    folder = Path(reference).resolve()
    labels_tr = folder.parent / "labelsTr"
    if folder.name in ("labelsTs", "imagesTs") or (labels_tr.is_dir() and (folder.parent / "dataset.json").is_file()
                                                    and folder != labels_tr.resolve()):
        raise UserError(f"-ref {reference}: JTT weights the training cases of the second training, and this folder "
                        f"holds the dataset's test cases (or others than its labelsTr); give predictions of the "
                        f"training images with -ref {labels_tr}, or the trainer folder of the first training")


def _check_training_cases(reference: str | Path, cases: Sequence[str], folds: Sequence[int] | None = None) -> None:
    """Every scored case must be a training case of the dataset, and every training case scored,
    where the dataset can be told (a ``labelsTr`` beside the reference folder):
    nnUNetTrainerCaseWeights needs a weight for each case it may draw, so a table of some folds'
    cases (``-f 0``) would stop the second training before it starts."""
    from nnunet_dro.evaluation.io import list_segmentations

    labels_tr = Path(reference).resolve().parent / "labelsTr"
    if not labels_tr.is_dir():
        return
    training = set(list_segmentations(str(labels_tr), "labelsTr"))
    outside = [case for case in cases if case not in training]
    if outside:
        raise UserError(f"{len(outside)} scored case(s) are not training cases of {labels_tr.parent.name} (not in "
                        f"{labels_tr}): {', '.join(outside[:3])}{' ...' if len(outside) > 3 else ''}; JTT weights "
                        f"training cases only")
    unscored = sorted(training - set(cases))
    if unscored:
        which = f" (-f {' '.join(map(str, folds))} validates only these folds' cases)" if folds is not None else ""
        raise UserError(f"{len(unscored)} of the {len(training)} training cases of {labels_tr.parent.name} have no "
                        f"score{which}: {', '.join(unscored[:3])}{' ...' if len(unscored) > 3 else ''}; the second "
                        f"training (nnUNetTrainerCaseWeights) needs a weight for every training case: score them all "
                        f"(every fold's validation, or predictions of every training image)")
