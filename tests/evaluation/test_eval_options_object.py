"""EvaluationOptions: the options of evaluate() as one frozen, checked object; keyword overrides
of evaluate(), check_inputs() and evaluate_runs() keep working beside it."""
from __future__ import annotations

import dataclasses
import inspect

import pandas as pd
import pytest

from eval_testdata import make_cohort
from nnunet_dro.cli import build_parser
from nnunet_dro.commands.evaluate import _options
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation import EvaluationOptions, evaluate
from nnunet_dro.evaluation.api import check_inputs
from nnunet_dro.evaluation.multirun import evaluate_runs
from nnunet_dro.evaluation.options import EvaluationOptionError

#: the keyword defaults of evaluate() before the options became one object (its signature then)
OLD_DEFAULTS = dict(groups=None, group_by=None, case_column="case", groups_partial=False, regions=None,
                    metrics=("dice",), percentiles=(25, 10, 5), empty="one", missing="error", num_processes=None,
                    n_bootstrap=0, strict=True, progress=True, folds=None, nsd_tolerance=None, echo=None,
                    gallery=4, images=None)  # the gallery's options (issue 82) came later


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    ref, preds = make_cohort(tmp_path_factory.mktemp("options_object"), n_cases=4, methods=("A", "B"))
    return str(ref), {name: str(folder) for name, folder in preds.items()}


def test_defaults_are_the_old_keyword_defaults():
    parameters = inspect.signature(EvaluationOptions).parameters
    assert {name: p.default for name, p in parameters.items()} == OLD_DEFAULTS
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters.values())
    assert dataclasses.asdict(EvaluationOptions()) == OLD_DEFAULTS


def test_the_cli_defaults_are_the_defaults():
    args = build_parser().parse_args(["evaluate", "-ref", "gt", "-pred", "A=p", "-o", "out"])
    assert _options(args) == EvaluationOptions()


def test_values_are_normalised():
    options = EvaluationOptions(metrics=["Dice", "topology", "dice"], percentiles=[10, 5.0, 10],
                                group_by=["condition"], groups="g.tsv", folds=[0, 2])
    assert options.metrics == ("dice", "euler", "b0", "b1", "b2")
    assert options.percentiles == (10.0, 5.0)
    assert options.group_by == ("condition",) and options.folds == (0, 2)
    assert EvaluationOptions(metrics="hd95").metrics == ("hd95",)


@pytest.mark.parametrize("changes, message", [
    (dict(metrics=["dcie"]), "unknown metric 'dcie' (choose from dice, hd95, vs, nsd, euler, b0, b1, b2, "
                             "topology)"),
    (dict(metrics=[]), "unknown metric '' (choose from"),
    (dict(percentiles=[10, 101]), "--percentiles: 101 is not between 0 and 100"),
    (dict(percentiles=[float("nan")]), "--percentiles: nan is not between 0 and 100"),
    (dict(empty="zero"), "--empty 'zero': choose one of one, nan"),
    (dict(missing="ignore"), "--missing 'ignore': choose one of error, worst, skip"),
    (dict(num_processes=0), "-np 0: need at least 1 process"),
    (dict(n_bootstrap=-3), "--bootstrap -3: must be 0 (off) or a positive number of resamples"),
    (dict(group_by=["condition"]), "--group-by needs a group table (-groups TABLE.csv|.tsv)"),
    (dict(nsd_tolerance=-1.0), "--nsd-tolerance -1: give a distance in mm, 0 or more"),
    (dict(nsd_tolerance=float("inf")), "--nsd-tolerance inf: give a distance in mm, 0 or more"),
])
def test_invalid_values_raise_the_cli_messages(changes, message):
    with pytest.raises(EvaluationOptionError) as raised:
        EvaluationOptions(**changes)
    assert str(raised.value).startswith(message)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, UserError)
    with pytest.raises(EvaluationOptionError):  # and so does a copy with the bad value
        EvaluationOptions().with_overrides(**changes)


def test_frozen():
    options = EvaluationOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.metrics = ("hd95",)


def test_with_overrides_copies():
    options = EvaluationOptions(metrics=["dice", "hd95"], empty="nan")
    changed = options.with_overrides(missing="worst", percentiles=[10])
    assert (changed.missing, changed.percentiles, changed.metrics, changed.empty) == \
        ("worst", (10.0,), ("dice", "hd95"), "nan")
    assert (options.missing, options.percentiles) == ("error", (25.0, 10.0, 5.0))
    assert options.with_overrides() == options
    with pytest.raises(TypeError, match="with_overrides\\(\\) got an unexpected keyword argument 'metric'"):
        options.with_overrides(metric=["dice"])


def _frames(result):
    return result.per_case, result.summary, result.comparison


def test_options_object_gives_what_the_keywords_give(cohort):
    ref, preds = cohort
    fields = dict(metrics=["dice", "hd95"], percentiles=[20, 10], empty="nan", missing="worst", num_processes=1,
                  n_bootstrap=20, progress=False, regions="a=1;b=2,3")
    by_keywords = evaluate(ref, preds, None, **fields)
    by_object = evaluate(ref, preds, None, options=EvaluationOptions(**fields))
    mixed = evaluate(ref, preds, None, EvaluationOptions(**fields).with_overrides(empty="one"), empty="nan")
    for result in (by_object, mixed):
        for ours, theirs in zip(_frames(result), _frames(by_keywords)):
            pd.testing.assert_frame_equal(ours, theirs)
        assert result.settings == by_keywords.settings
    assert by_keywords.settings["percentiles"] == [20.0, 10.0]
    plain = evaluate(ref, preds, None, progress=False, num_processes=1)
    pd.testing.assert_frame_equal(plain.summary, evaluate(ref, preds, None, EvaluationOptions(
        progress=False, num_processes=1)).summary)


@pytest.mark.parametrize("call", [
    lambda ref, preds: evaluate(ref, preds, None, metric=["dice"]),
    lambda ref, preds: check_inputs(ref, list(preds), None, metric=["dice"]),
    lambda ref, preds: evaluate_runs(ref, {name: [folder] for name, folder in preds.items()}, None,
                                     metric=["dice"]),
], ids=["evaluate", "check_inputs", "evaluate_runs"])
def test_unknown_keyword_is_a_type_error_naming_it(cohort, call):
    ref, preds = cohort
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'metric'"):
        call(ref, preds)


def test_options_must_be_an_evaluation_options(cohort):
    ref, preds = cohort
    with pytest.raises(TypeError, match="options must be an EvaluationOptions, not dict"):
        evaluate(ref, preds, None, {"metrics": ["dice"]})


def test_check_inputs_takes_the_object(cohort):
    ref, preds = cohort
    inputs = check_inputs(ref, list(preds), None, EvaluationOptions(metrics=["topology"], num_processes=3))
    assert inputs.metrics == ["euler", "b0", "b1", "b2"] and inputs.num_processes == 3
    assert check_inputs(ref, list(preds), None, EvaluationOptions(), num_processes=2).num_processes == 2
