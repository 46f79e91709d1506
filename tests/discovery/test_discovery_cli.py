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


# ---------------------------------------------------------------- issue 80 items 8, 10 and 11
@pytest.fixture(scope="module")
def zero_dice(tmp_path_factory):
    """30 cases, 9 of them predicted empty (Dice 0 in every region), the others mildly degraded."""
    import numpy as np
    import SimpleITK as sitk

    from discovery_testdata import degrade

    root = tmp_path_factory.mktemp("zero_dice")
    dataset = make_cohort(root, n_test=30, seed=5)
    files = sorted((dataset / "labelsTs").glob("*.nii.gz"))
    planted = {f.name[:-len(".nii.gz")] for f in files[::3][:9]}
    pred = root / "pred"
    pred.mkdir()
    rng = np.random.default_rng(0)
    for path in files:
        image = sitk.ReadImage(str(path))
        label = sitk.GetArrayFromImage(image)
        case = path.name[:-len(".nii.gz")]
        out = sitk.GetImageFromArray(np.zeros_like(label) if case in planted else degrade(label, False, rng))
        out.CopyInformation(image)
        sitk.WriteImage(out, str(pred / path.name), True)
    return {"root": root, "dataset": dataset, "pred": pred, "planted": planted}


def _discover(world, out, *extra, check=True):
    return run_cli(["discover", "-pred", world["pred"], "-ref", world["dataset"] / "labelsTs", "-i",
                    world["dataset"] / "imagesTs", "-regions", "feta", "-o", out, "--bootstrap", 50, "-np", 2, *extra],
                   check=check)


def test_nine_zero_dice_cases_in_thirty_found_as_one_group_or_named(zero_dice, tmp_path):
    """Below --min-size 10 the 9 gave 'No group stands out' with no word why; at --min-size 5 they
    were spread over four groups."""
    result = _discover(zero_dice, tmp_path / "default")
    groups = json.loads((tmp_path / "default" / "groups.json").read_text())
    assert groups["k"] == 1
    blocked = [line for line in result.stderr.splitlines() if line.startswith("note: a split into")]
    assert len(blocked) == 1 and "group of 9 cases is below --min-size 10" in blocked[0], result.stderr
    assert "--min-size 9 would report it" in (tmp_path / "default" / "report.md").read_text()
    for min_size in ("5", "25%"):  # 25 % of 30: 8 cases
        out = tmp_path / f"m{min_size[:-1] if min_size.endswith('%') else min_size}"
        result = _discover(zero_dice, out, "--min-size", min_size)
        groups = json.loads((out / "groups.json").read_text())
        assert set(groups["groups"][0]["cases"]) == zero_dice["planted"], (min_size, groups["groups"])
        assert "note: a split" not in result.stderr
        words = " ".join(f["text"] for g in groups["groups"] for f in g["features"])
        assert " Dice (100 vs 100 %)" not in words and "(0 vs 0 mm)" not in words  # never high/low for equals
    assert json.loads((tmp_path / "m25" / "groups.json").read_text())["settings"]["min_size"] == 8


def test_missing_predictions_follow_the_evaluation_and_name_the_folder(zero_dice, tmp_path):
    pred = tmp_path / "my_model"
    shutil.copytree(zero_dice["pred"], pred)
    gone = sorted(pred.glob("*.nii.gz"))[-1]
    gone.unlink()
    world = {**zero_dice, "pred": pred}
    result = _discover(world, tmp_path / "o", check=False)
    assert result.returncode == 2 and "my_model has no prediction for 1 case(s)" in result.stderr
    assert "--missing worst or --missing skip" in result.stderr and "discover has" not in result.stderr
    assert not (tmp_path / "o").exists()
    named = _discover({**world, "pred": f"mine={pred}"}, tmp_path / "o", check=False)
    assert named.returncode == 2 and "mine has no prediction for 1 case(s)" in named.stderr
    skipped = _discover(world, tmp_path / "skip", "--missing", "skip", "--min-size", 5)
    assert "1 case(s) without prediction skipped (--missing skip)" in skipped.stderr
    assert json.loads((tmp_path / "skip" / "groups.json").read_text())["n_cases"] == 29
    _discover(world, tmp_path / "worst", "--missing", "worst", "--min-size", 5)
    groups = json.loads((tmp_path / "worst" / "groups.json").read_text())
    assert groups["n_cases"] == 30 and gone.name[:-len(".nii.gz")] in groups["groups"][0]["cases"]


def test_progress_is_shown_while_cases_are_read(zero_dice, capfd):
    from nnunet_dro.discovery.api import discover

    discover(str(zero_dice["pred"]), str(zero_dice["dataset"] / "labelsTs"), None,
             images=str(zero_dice["dataset"] / "imagesTs"), regions="feta", num_processes=1, n_bootstrap=0,
             min_size=5, progress=True)
    err = capfd.readouterr().err
    assert "Reading cases" in err and "Reading volumes and images" in err and "/30 [" in err
    discover(str(zero_dice["pred"]), str(zero_dice["dataset"] / "labelsTs"), None, regions="feta",
             num_processes=1, n_bootstrap=0, min_size=5, progress=False)
    assert "Reading" not in capfd.readouterr().err
