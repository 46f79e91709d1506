"""``nnunet_dro discover`` end to end on a small cohort: a synthetic fetal test set
(``make-synthetic``, real NIfTI files) with predictions made from its references, degraded on
purpose for a planted subgroup of 12 cases (not a network's predictions: the test checks that the
command recovers the planted group). Its ``subgroups.tsv`` then feeds ``nnunet_dro evaluate
-groups`` unchanged."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from discovery_testdata import make_cohort, make_predictions, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("discover")
    dataset = make_cohort(root)
    table = pd.read_csv(dataset / "subgroups.tsv", sep="\t")
    test = table[table["split"] == "test"]
    planted = set(test["case"][test["condition"] == "other"].head(12))
    predictions = make_predictions(dataset, root / "pred", planted)
    out = root / "discovery"
    result = run_cli(["discover", "-pred", predictions, "-ref", dataset / "labelsTs", "-i", dataset / "imagesTs",
                      "-regions", "feta", "-o", out, "--min-size", 6, "--bootstrap", 200, "-np", 2])
    return {"root": root, "dataset": dataset, "planted": planted, "pred": predictions, "out": out,
            "stdout": result.stdout}


def test_planted_group_is_recovered_as_the_hardest(cohort):
    groups = json.loads((cohort["out"] / "groups.json").read_text())
    hardest = groups["groups"][0]
    assert hardest["name"] == "g1"
    assert set(hardest["cases"]) == cohort["planted"]
    assert groups["k"] >= 2 and sum(g["size"] for g in groups["groups"]) == 60
    assert all(g["size"] >= 6 for g in groups["groups"])
    words = [f["text"] for f in hardest["features"]]
    assert any("low cerebellum Dice" in w for w in words)
    cerebellum = next(row for row in hardest["tail"] if row["region"] == "cerebellum")
    assert cerebellum["diff_mean_high"] < 0 and cerebellum["diff_cvar10_high"] < 0
    assert not hardest["suspect_labels"]  # the references are clean


def test_outputs_and_report(cohort):
    out = cohort["out"]
    assert sorted(p.name for p in out.iterdir()) == ["features.tsv", "groups.json", "report.md", "subgroups.tsv"]
    report = (out / "report.md").read_text()
    assert "## g1: 12 cases" in report and "case-resampling bootstrap" in report
    features = pd.read_csv(out / "features.tsv", sep="\t")
    assert {"dice:cerebellum", "hd95:cerebellum", "ref_volume:cerebellum", "pred_volume:cerebellum",
            "contrast:cerebellum", "intensity:cerebellum", "discovered_group"} <= set(features.columns)
    assert "g1\t12 cases" in cohort["stdout"]


def test_subgroups_feed_evaluate_unchanged(cohort):
    report = cohort["root"] / "evaluation"
    run_cli(["evaluate", "-ref", cohort["dataset"] / "labelsTs", "-pred", f"P={cohort['pred']}", "-groups",
             cohort["out"] / "subgroups.tsv", "--group-by", "discovered_group", "-regions", "feta", "-o", report,
             "-np", 2])
    summary = pd.read_csv(report / "summary.csv")
    g1 = summary[(summary["group"] == "g1") & (summary["region"] == "cerebellum")]
    assert int(g1["n"].iloc[0]) == 12
    groups = json.loads((cohort["out"] / "groups.json").read_text())
    tail = next(row for row in groups["groups"][0]["tail"] if row["region"] == "cerebellum")
    assert float(g1["mean"].iloc[0]) == pytest.approx(tail["group_mean"])
    assert float(g1["p10"].iloc[0]) == pytest.approx(tail["group_p10"])


def test_trainer_folder_reads_cross_validation_and_hardness(cohort, tmp_path):
    """A trainer-folder layout (fold_N/validation, fold_N/dro_hardness.csv) built from the same files."""
    trainer = tmp_path / "Dataset901_Disc" / "nnUNetTrainerDROAdaptive__nnUNetPlans__3d_fullres"
    files = sorted(cohort["pred"].glob("*.nii.gz"))
    for fold in (0, 1):
        validation = trainer / f"fold_{fold}" / "validation"
        validation.mkdir(parents=True)
        for path in files[fold::2]:
            shutil.copy(path, validation / path.name)
        trained = [p.name[:-7] for p in files[1 - fold::2]]
        pd.DataFrame({"case": trained, "stale_loss": [1.0 if c in cohort["planted"] else 0.1 for c in trained],
                      "probability": 1 / len(trained), "times_drawn": 10}).to_csv(
            trainer / f"fold_{fold}" / "dro_hardness.csv", index=False)
    out = tmp_path / "cv"
    run_cli(["discover", "-pred", trainer, "-ref", cohort["dataset"] / "labelsTs", "-regions", "feta", "-o", out,
             "--min-size", 6, "--bootstrap", 0, "--no-hd95", "-np", 1])
    features = pd.read_csv(out / "features.tsv", sep="\t", index_col="case")
    assert features.loc[sorted(cohort["planted"]), "hardness:stale_loss"].eq(1.0).all()
    assert "hd95:cerebellum" not in features and "contrast:cerebellum" not in features
    groups = json.loads((out / "groups.json").read_text())
    assert set(groups["groups"][0]["cases"]) == cohort["planted"]


@pytest.mark.parametrize("args, message", [
    (["-pred", "{pred}", "-o", "{tmp}/o"], "-ref is needed"),
    (["-pred", "{pred}", "-ref", "{tmp}/nothing", "-o", "{tmp}/o"], "reference folder does not exist"),
    (["-pred", "{pred}", "-ref", "{ref}", "-i", "{ref}", "-o", "{tmp}/o"], "no image"),
    (["-pred", "{pred}", "-ref", "{ref}", "-o", "{ref}"], "not a discovery's"),
    (["-pred", "{pred}", "-ref", "{ref}", "-o", "{tmp}/o", "--min-size", "40"], "too few"),
])
def test_bad_input_is_one_line_and_exit_2(cohort, tmp_path, args, message):
    values = {"pred": cohort["pred"], "ref": cohort["dataset"] / "labelsTs", "tmp": tmp_path}
    result = run_cli(["discover", *[a.format(**values) for a in args], "--no-hd95", "-np", 1], check=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
