"""Options of the real ``nnunet_dro evaluate`` CLI: regions that match nothing, numeric values."""
from __future__ import annotations

import pandas as pd
import pytest

from eval_testdata import make_cohort, run_cli
from nnunet_dro.errors import UserError

PREFIX = "nnunet_dro evaluate: error: "


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    ref, preds = make_cohort(root, n_cases=3, methods=("A",), labels=(1, 2, 3))  # labels 1-3 only
    return ref, preds["A"]


def _messages(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines()
            if line.strip() and not line.lstrip().startswith(("Reading cases", "Report written to"))]


def test_region_absent_from_every_reference_is_a_warning_with_allow_mismatch(cohort, tmp_path):
    ref, pred = cohort
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "-regions", "WM=1;X=7",
                   "--allow-mismatch")
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == [
        "warning: region X (label 7) occurs in no reference file (labels found: 1,2,3); such a region scores "
        "Dice 100 wherever the prediction is empty too (--empty one). Check -regions (going on: --allow-mismatch)"]
    scores = pd.read_csv(out / "per_case.csv")
    assert (scores.query("region == 'X'")["value"] == 100).all()  # what the warning is about


@pytest.mark.parametrize("strict", [[], ["--strict"]])  # --strict is the default, kept for scripts
def test_region_absent_from_every_reference_is_an_error_by_default(cohort, tmp_path, strict):
    ref, pred = cohort
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "-regions", "X=7;Y=8,9", *strict)
    assert done.returncode == 2, done.stderr
    assert _messages(done.stderr) == [
        f"{PREFIX}regions X (label 7); Y (labels 8,9) occur in no reference file (labels found: 1,2,3); check "
        f"-regions (or pass --allow-mismatch to go on with a warning)"]
    assert not out.exists()


def test_present_regions_give_no_warning(cohort, tmp_path):
    ref, pred = cohort
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r", "-np", "1", "-regions", "T=1,7;U=3",
                   "--strict")
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == []


@pytest.mark.parametrize("option, value, message", [
    ("--bootstrap", "-3", "argument --bootstrap: -3 is not an integer >= 0"),
    ("--bootstrap", "ten", "argument --bootstrap: ten is not an integer >= 0"),
    ("-np", "0", "argument -np: 0 is not a positive integer"),
    ("-np", "1.5", "argument -np: 1.5 is not a positive integer"),
    ("--percentiles", "nan", "argument --percentiles: nan is not a number between 0 and 100"),
    ("--percentiles", "-5", "argument --percentiles: -5 is not between 0 and 100"),
])
def test_numeric_options_are_checked_by_the_parser(cohort, tmp_path, option, value, message):
    ref, pred = cohort
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r", option, value)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == PREFIX + message
    assert not (tmp_path / "r").exists()


def test_api_rejects_negative_bootstrap(cohort):
    ref, pred = cohort
    with pytest.raises(UserError, match="--bootstrap -3: must be 0"):
        from nnunet_dro.evaluation import evaluate
        evaluate(str(ref), {"A": str(pred)}, None, n_bootstrap=-3, progress=False)
