"""Sub-commands that take the same options get them from one function each
(``commands/evaluation_options.py``, ``commands/dataset_options.py``): same names, help, defaults,
types and choices, and ``ensemble`` hands its evaluation options to ``evaluate`` unchanged, as one
EvaluationOptions."""
from __future__ import annotations

import argparse

import pytest

from nnunet_dro.cli import build_parser
from nnunet_dro.evaluation import EvaluationOptions

SHARED = {
    ("evaluate", "ensemble"): ["-ref", "-groups", "--group-by", "--case-column", "--groups-partial", "-regions",
                               "--metrics",
                               "--percentiles", "--empty", "--strict", "--allow-mismatch"],
    ("convert-feta", "convert-brats19", "make-synthetic"): ["--id", "--overwrite"],
    ("convert-feta", "convert-brats19"): ["--test-cases", "--test-fraction", "--seed"],
}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def described(action: argparse.Action, option: str) -> tuple:
    help_text = action.help
    if option == "--test-fraction":  # names what each converter stratifies by
        help_text = help_text.split(" of each ")[0]
    if option == "-ref":  # optional for ensemble, where it turns the evaluation on, and for evaluate with a
        help_text = help_text.split("; ")[0]  # trainer folder in -pred; each says so after "; "
    return action.dest, action.nargs, action.const, action.type, action.choices, action.metavar, help_text, action.default


@pytest.mark.parametrize("commands, option", [(c, o) for c, options in SHARED.items() for o in options])
def test_shared_options_are_defined_once(commands, option):
    parsers = subparsers()
    actions = {c: parsers[c]._option_string_actions.get(option) for c in commands}
    assert all(actions.values()), f"{option} missing in {[c for c, a in actions.items() if a is None]}"
    descriptions = {c: described(a, option) for c, a in actions.items()}
    assert all(d == next(iter(descriptions.values())) for d in descriptions.values()), descriptions


def test_ensemble_hands_its_evaluation_options_to_evaluate(monkeypatch):
    import nnunet_dro.workflows.ensemble as ensemble
    import nnunet_dro.workflows.nnunet_commands as nnunet_commands

    seen = {}

    def fake_run_ensemble(env, dataset_id, images, output, members, *, reference, evaluation, **kwargs):
        seen.update(reference=reference, evaluation=evaluation)
        return {}, None

    monkeypatch.setattr(ensemble, "run_ensemble", fake_run_ensemble)
    monkeypatch.setattr(nnunet_commands, "nnunet_environment", lambda: {})
    args = build_parser().parse_args(
        ["ensemble", "-d", "1", "-i", "imgs", "-o", "out", "-tr", "nnUNetTrainer", "-ref", "gt",
         "-groups", "g.tsv", "--case-column", "id", "--group-by", "condition", "--percentiles", "10", "5",
         "-regions", "feta", "--metrics", "dice", "hd95", "--empty", "nan", "--strict"])
    assert args.func(args) == 0
    assert seen == dict(reference="gt", evaluation=EvaluationOptions(
        groups="g.tsv", group_by=["condition"], case_column="id", groups_partial=False, regions="feta",
        metrics=["dice", "hd95"], percentiles=[10.0, 5.0], empty="nan", strict=True, nsd_tolerance=None))
