"""evaluate(): agreement with nnU-Net, statistics, policies, geometry checks, atomic outputs."""
import json
import os

import numpy as np
import pandas as pd
import pytest

from eval_testdata import make_cohort, write_label_map
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation import evaluate


@pytest.fixture
def cohort(tmp_path):
    ref, preds = make_cohort(tmp_path, n_cases=5, methods=("A", "B"))
    return tmp_path, ref, preds


def dice_table(result, method):
    frame = result.per_case[(result.per_case["method"] == method) & (result.per_case["metric"] == "dice")]
    return frame.set_index(["case", "region"])["value"]


@pytest.mark.slow
def test_dice_equals_nnunet_compute_metrics_on_folder_and_its_summary_json(cohort):
    """Dice equals nnunetv2's compute_metrics_on_folder (labels and a region), and feeding its
    summary.json back in gives the same per-case Dice as the folder."""
    from nnunetv2.evaluation.evaluate_predictions import compute_metrics_on_folder
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO

    root, ref, preds = cohort
    # make label 3 absent from both sides in one case: nnU-Net gives NaN, as does --empty nan
    for folder in (ref, preds["A"]):
        path = folder / "case_002.nii.gz"
        import SimpleITK as sitk
        array = sitk.GetArrayFromImage(sitk.ReadImage(str(path)))
        array[array == 3] = 0
        write_label_map(path, array, spacing=(1.0, 1.0, 2.0))
    nnunet_json = root / "nnunet_summary.json"
    theirs = compute_metrics_on_folder(str(ref), str(preds["A"]), str(nnunet_json), SimpleITKIO(), ".nii.gz",
                                       [1, 2, 3, (1, 2)], None, num_processes=1)
    ours = evaluate(str(ref), {"A": str(preds["A"])}, None, regions="l1=1;l2=2;l3=3;l12=1,2", empty="nan",
                    progress=False, num_processes=1)
    dice = dice_table(ours, "A")
    names = {1: "l1", 2: "l2", 3: "l3", (1, 2): "l12"}
    compared = 0
    for entry in theirs["metric_per_case"]:
        case = os.path.basename(entry["reference_file"])[: -len(".nii.gz")]
        for key, metrics in entry["metrics"].items():
            expected = 100 * metrics["Dice"]
            np.testing.assert_allclose(dice[(case, names[key])], expected, rtol=1e-12)
            compared += not np.isnan(expected)
    assert compared == 5 * 4 - 1
    from_json = evaluate(str(ref), {"A": str(nnunet_json)}, None, regions="l1=1;l2=2;l3=3;l12=1,2", empty="nan",
                         progress=False, num_processes=1)
    pd.testing.assert_series_equal(dice_table(from_json, "A"), dice, check_exact=False, rtol=1e-12)


def test_statistics_equal_numpy_per_group(cohort, tmp_path):
    _, ref, preds = cohort
    table = tmp_path / "groups.csv"
    table.write_text("case,site\n" + "".join(f"case_{i:03d},{'X' if i < 2 else 'Y'}\n" for i in range(5)))
    result = evaluate(str(ref), {"A": str(preds["A"]), "B": str(preds["B"])}, None, groups=str(table),
                      percentiles=[25, 10, 5, 90], progress=False, num_processes=1)
    assert set(result.summary["group"]) == {"all", "X", "Y"}
    for _, row in result.summary.iterrows():
        values = result.per_case[(result.per_case["method"] == row["method"])
                                 & (result.per_case["region"] == row["region"])
                                 & (result.per_case["metric"] == row["metric"])]
        if row["group_column"] != "all":
            values = values[values[row["group_column"]] == row["group"]]
        v = values["value"].to_numpy(float)
        assert row["n"] == len(v) == (5 if row["group"] == "all" else 2 if row["group"] == "X" else 3)
        assert row["mean"] == pytest.approx(np.mean(v))
        assert row["median"] == pytest.approx(np.median(v))
        assert row["iqr"] == pytest.approx(np.percentile(v, 75) - np.percentile(v, 25))
        for q in (25, 10, 5, 90):
            assert row[f"p{q}"] == pytest.approx(np.percentile(v, q))


def test_empty_and_missing_policies(tmp_path):
    ref_dir, pred_dir = tmp_path / "ref", tmp_path / "pred"
    a = np.zeros((6, 6, 6), np.uint8)
    a[1:4, 1:4, 1:4] = 1
    only_pred = a.copy()
    only_pred[5, 5, 5] = 2  # label 2: absent from the reference of this case, present in the prediction
    write_label_map(ref_dir / "c1.nii.gz", a)
    write_label_map(pred_dir / "c1.nii.gz", only_pred)
    b = a.copy()
    b[0, 0, 0] = 2
    write_label_map(ref_dir / "c2.nii.gz", b)
    write_label_map(pred_dir / "c2.nii.gz", b)
    write_label_map(ref_dir / "c3.nii.gz", a)  # prediction missing
    diagonal = np.sqrt(3 * 36)
    # region "none" (label 3) is in no reference file: an error by default, scored here on purpose
    kwargs = dict(metrics=["dice", "hd95", "vs"], regions="one=1;two=2;none=3", progress=False, num_processes=1,
                  strict=False)

    with pytest.raises(UserError, match="A has no prediction for 1 case.*c3"):
        evaluate(str(ref_dir), {"A": str(pred_dir)}, None, **kwargs)

    def value(result, case, region, metric):
        pc = result.per_case
        rows = pc[(pc.case == case) & (pc.region == region) & (pc.metric == metric)]
        return rows["value"].item() if len(rows) else None

    worst = evaluate(str(ref_dir), {"A": str(pred_dir)}, None, missing="worst", empty="one", **kwargs)
    assert value(worst, "c3", "one", "dice") == 0 and value(worst, "c3", "one", "vs") == 0
    assert value(worst, "c3", "one", "hd95") == pytest.approx(diagonal)
    assert value(worst, "c1", "two", "dice") == 0  # one side empty
    assert value(worst, "c1", "two", "hd95") == pytest.approx(diagonal)
    notes = worst.per_case.query("case == 'c1' and region == 'two'").set_index("metric")["note"]
    assert notes["hd95"].startswith("one side empty") and notes["vs"] == "" and notes["dice"] == ""
    assert value(worst, "c1", "none", "dice") == 100 and value(worst, "c1", "none", "hd95") == 0  # both empty
    assert value(worst, "c2", "two", "dice") == 100 and value(worst, "c2", "two", "hd95") == 0
    note = worst.per_case.query("case == 'c1' and region == 'none'")["note"].iloc[0]
    assert "empty in reference and prediction" in note
    assert set(worst.per_case["empty_policy"]) == {"one"} and set(worst.summary["missing_policy"]) == {"worst"}

    skipped = evaluate(str(ref_dir), {"A": str(pred_dir)}, None, missing="skip", empty="nan", **kwargs)
    assert value(skipped, "c3", "one", "dice") is None
    assert np.isnan(value(skipped, "c1", "none", "dice")) and np.isnan(value(skipped, "c1", "none", "hd95"))
    row = skipped.summary.query("region == 'none' and metric == 'dice'").iloc[0]
    assert row["n"] == 0 and np.isnan(row["mean"])  # left out, NaN never spreads into other rows
    row = skipped.summary.query("region == 'one' and metric == 'dice'").iloc[0]
    assert row["n"] == 2 and row["mean"] == 100
    assert skipped.cases["methods"]["A"]["missing_predictions"] == ["c3"]


@pytest.mark.parametrize("change,message", [
    (dict(shape=(6, 6, 5)), "shape mismatch"),
    (dict(spacing=(1.0, 1.0, 1.5)), "spacing mismatch"),
    (dict(origin=(0.0, 3.0, 0.0)), "origin mismatch"),
    (dict(direction=(0, 1, 0, 1, 0, 0, 0, 0, 1)), "direction mismatch"),
])
def test_geometry_mismatch_names_the_case_and_writes_nothing(tmp_path, change, message):
    a = np.zeros((6, 6, 6), np.uint8)
    a[2:4, 2:4, 2:4] = 1
    write_label_map(tmp_path / "ref" / "good.nii.gz", a)
    write_label_map(tmp_path / "pred" / "good.nii.gz", a)
    write_label_map(tmp_path / "ref" / "bad.nii.gz", a)
    shape = change.pop("shape", a.shape)
    write_label_map(tmp_path / "pred" / "bad.nii.gz", np.zeros(shape, np.uint8), **change)
    with pytest.raises(UserError, match=f"case 'bad'.*{message}"):
        evaluate(str(tmp_path / "ref"), {"A": str(tmp_path / "pred")}, str(tmp_path / "out"), progress=False,
                 num_processes=1)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_label_checks(tmp_path):
    a = np.zeros((5, 5, 5), np.uint8)
    a[1:3, 1:3, 1:3] = 1
    write_label_map(tmp_path / "ref" / "c1.nii.gz", a)
    p = a.copy()
    p[4, 4, 4] = 7
    write_label_map(tmp_path / "pred" / "c1.nii.gz", p)
    with pytest.raises(UserError, match=r"case 'c1': label value 7 in .*pred.*c1.nii.gz \(method A\)"):
        evaluate(str(tmp_path / "ref"), {"A": str(tmp_path / "pred")}, None, progress=False, num_processes=1)
    r = a.copy()
    r[0, 0, 0] = 3
    write_label_map(tmp_path / "ref" / "c1.nii.gz", r)
    with pytest.raises(UserError, match=r"label value 3 in .*ref.*c1.nii.gz is not among the labels declared by "
                                        r"preset brats"):
        evaluate(str(tmp_path / "ref"), {"A": str(tmp_path / "pred")}, None, regions="brats", progress=False,
                 num_processes=1)


def test_report_files_columns_and_policies(cohort, tmp_path):
    _, ref, preds = cohort
    table = tmp_path / "groups.tsv"
    table.write_text("case\tcondition\tga\n" + "".join(f"case_{i:03d}\t{'sb' if i % 2 else 'control'}\t{20 + 3 * i}\n"
                                                     for i in range(4)) + "case_999\tsb\t30\n")
    out = tmp_path / "report"
    notes = []
    # case_004 has no row: an error by default (test_eval_groups.py), its own group with groups_partial
    evaluate(str(ref), {"ERM": str(preds["A"]), "DRO": str(preds["B"])}, str(out), groups=str(table),
             group_by=["condition", "ga:19,25,31"], groups_partial=True, metrics=["dice", "hd95", "vs"],
             num_processes=1, n_bootstrap=50, progress=False, echo=notes.append)
    assert any("case_004" in n and "missing from group table" in n and "(not in table)" in n for n in notes)
    assert any("case_999" in n and "no reference" in n for n in notes)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["per_case.csv", "summary.csv", "summary.json", "table.md", "table.tex", "comparison.csv",
         "boxplots_dice.png", "boxplots_hd95.png", "boxplots_vs.png", "disparity.csv", "disparity_dice.png",
         "disparity_hd95.png", "disparity_vs.png", "report.html"])
    per_case = pd.read_csv(out / "per_case.csv")
    assert list(per_case.columns[:7]) == ["method", "case", "region", "metric", "value", "condition", "ga"]
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns[:13]) == ["method", "group_column", "group", "region", "metric", "n", "mean", "std",
                                          "median", "iqr", "p25", "p10", "p5"]
    assert {"cvar10", "cvar10_ci_low", "mean_ci_high", "direction", "same_cases"} <= set(summary.columns)
    assert set(summary["group"]) == {"all", "control", "sb", "[19,25)", "[25,31)", "(not in table)"}
    comparison = pd.read_csv(out / "comparison.csv")
    for column in ["method", "reference_method", "group", "region", "metric", "mean_difference", "wilcoxon_p",
                   "holm_p", "p10_difference_ci_low", "p10_difference_ci_high"]:
        assert column in comparison.columns
    assert (comparison["holm_p"] >= comparison["wilcoxon_p"]).all()
    content = json.loads((out / "summary.json").read_text())
    assert content["settings"]["empty_policy"] == "one" and content["settings"]["missing_policy"] == "error"
    assert content["cases"]["groups"]["cases_not_in_group_table"] == ["case_004"]
    assert len(content["summary"]) == len(summary)
    markdown = (out / "table.md").read_text()
    assert "--empty one" in markdown and "**" in markdown and "| group | method | region |" in markdown
    assert "--empty one" in (out / "table.tex").read_text()
    assert (out / "boxplots_dice.png").read_bytes()[:4] == b"\x89PNG"


def test_existing_output_folder_keeps_other_files(cohort, tmp_path):
    _, ref, preds = cohort
    out = tmp_path / "out"
    evaluate(str(ref), {"A": str(preds["A"]), "B": str(preds["B"])}, str(out), num_processes=1, progress=False)
    (out / "mine.txt").write_text("keep me")
    evaluate(str(ref), {"A": str(preds["A"])}, str(out), num_processes=1, progress=False)
    names = sorted(p.name for p in out.iterdir())
    assert "mine.txt" in names and "comparison.csv" not in names  # stale comparison of the 2-method run removed
    assert not [n for n in names if n.startswith(".")]


@pytest.mark.parametrize("existing", [False, True])
def test_failure_while_writing_leaves_no_partial_files(cohort, tmp_path, monkeypatch, existing):
    from nnunet_dro.evaluation import reports

    _, ref, preds = cohort
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "summary.csv").write_text("old")

    def broken_plot(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(reports, "write_boxplots", broken_plot)
    with pytest.raises(UserError, match=r"cannot write the report \(disk full\); " +
                       ("the previous report is unchanged" if existing else "nothing was written")):
        evaluate(str(ref), {"A": str(preds["A"])}, str(out), num_processes=1, progress=False)
    if existing:
        assert sorted(p.name for p in out.iterdir()) == ["summary.csv"]
        assert (out / "summary.csv").read_text() == "old"
    else:
        assert not out.exists()
    assert not [p for p in tmp_path.rglob(".*")]
