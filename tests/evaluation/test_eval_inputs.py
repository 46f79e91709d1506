"""Region specs, group tables (binning, bad tables) and case listing."""
import json

import numpy as np
import pytest

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.groups import GroupColumn, assign_groups, parse_group_by
from nnunet_dro.evaluation.io import list_segmentations, load_nnunet_summary, split_case_id
from nnunet_dro.evaluation.regions import parse_regions


@pytest.mark.parametrize("spec,expected", [
    ("feta", {"white_matter": (3,), "intra_axial_csf": (4,), "cerebellum": (5,)}),
    ("brats", {"ET": (4,), "TC": (1, 4), "WT": (1, 2, 4)}),
    ("brats-nnunet", {"ET": (3,), "TC": (2, 3), "WT": (1, 2, 3)}),
    ("A=1,2;B=3", {"A": (1, 2), "B": (3,)}),
    (" WT = 4,2,1 ; ", {"WT": (1, 2, 4)}),
])
def test_region_specs(spec, expected):
    assert {r.name: r.labels for r in parse_regions(spec).regions} == expected


def test_default_regions_are_decided_from_data():
    assert parse_regions(None).regions is None


@pytest.mark.parametrize("spec,message", [
    ("fetal", "unknown region preset 'fetal'"),
    ("A=", "malformed region"),
    ("A=1;A=2", "given twice"),
    ("A=x", "must be integers"),
    ("A=0,1", "background"),
    ("missing/dataset.json", "not found"),
])
def test_bad_region_specs(spec, message):
    with pytest.raises(UserError, match=message):
        parse_regions(spec)


def test_dataset_json_labels_and_regions(tmp_path):
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"labels": {"background": 0, "liver": 1, "tumour": 2, "ignore": 3},
                                  "file_ending": ".nii.gz"}))
    spec = parse_regions(str(labels))
    assert {r.name: r.labels for r in spec.regions} == {"liver": (1,), "tumour": (2,)}
    assert spec.ignore_label == 3 and spec.declared_labels == {0, 1, 2, 3} and spec.file_ending == ".nii.gz"
    regions = tmp_path / "regions.json"
    regions.write_text(json.dumps({"labels": {"background": 0, "whole tumor": [1, 2, 3], "tumor core": [2, 3],
                                              "enhancing tumor": 3}, "regions_class_order": [1, 2, 3]}))
    spec = parse_regions(str(regions))
    assert {r.name: r.labels for r in spec.regions} == {"whole tumor": (1, 2, 3), "tumor core": (2, 3),
                                                        "enhancing tumor": (3,)}


@pytest.mark.parametrize("name,expected", [
    ("a.nii.gz", ("a", ".nii.gz")), ("b_0001.nii", ("b_0001", ".nii")), ("c.nrrd", ("c", ".nrrd")),
    ("x.png", ("x", ".png")), ("summary.json", None), ("p.npz", None), (".hidden.nii.gz", None),
])
def test_case_identifiers(name, expected):
    assert split_case_id(name) == expected


def test_listing_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        list_segmentations(str(tmp_path / "nope"), "reference folder")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="contains no segmentation files"):
        list_segmentations(str(tmp_path), "reference folder")
    (tmp_path / "c.nii").write_bytes(b"")
    (tmp_path / "c.nii.gz").write_bytes(b"")
    with pytest.raises(UserError, match="two files"):
        list_segmentations(str(tmp_path), "reference folder")


def test_group_binning_syntax():
    assert parse_group_by(["ga:19,25,30"]) == [GroupColumn("ga", (19.0, 25.0, 30.0))]
    g = GroupColumn("ga", (19.0, 25.0, 30.0))
    assert [g.bin_label(v) for v in (18, 19, 24.99, 25, 29.9, 30, 41)] == \
        ["<19", "[19,25)", "[19,25)", "[25,30)", "[25,30)", ">=30", ">=30"]
    for bad in ["ga:30,19", "ga:1", "ga:a,b", "ga:1,inf"]:
        with pytest.raises(UserError):
            parse_group_by([bad])


def write(path, text):
    path.write_text(text)
    return str(path)


def test_assign_groups_reports_missing_rows_and_cases(tmp_path):
    table = write(tmp_path / "g.tsv", "case\tcondition\tga\nc1.nii.gz\tcontrol\t20.5\nc2\tsb\t33\nc9\tsb\t30\n"
                                      "c3\tn/a\t26\n")
    with pytest.raises(UserError, match=r"1 of 4 evaluated cases has no row \(e.g. c4\) and 1 row matches no case "
                                        r"\(e.g. c9\)"):
        assign_groups(table, "case", ["condition", "ga:19,25,30,35"], ["c1", "c2", "c3", "c4"])
    a = assign_groups(table, "case", ["condition", "ga:19,25,30,35"], ["c1", "c2", "c3", "c4"], partial=True)
    assert a.labels["condition"] == {"c1": "control", "c2": "sb", "c3": None, "c4": "(not in table)"}
    assert a.labels["ga"] == {"c1": "[19,25)", "c2": "[30,35)", "c3": "[25,30)", "c4": "(not in table)"}
    assert a.order["ga"] == ["[19,25)", "[25,30)", "[30,35)", "(not in table)"]
    assert a.cases_not_in_table == ["c4"] and a.rows_without_reference == ["c9"]
    assert a.cases_without_value == {"condition": ["c3"]}


@pytest.mark.parametrize("n_cases", [3, 8, 12])
@pytest.mark.parametrize("ga", ["{:.1f}", "{:.0f}"], ids=["fractional", "whole weeks"])
def test_default_grouping_leaves_continuous_columns_out(tmp_path, n_cases, ga):
    """Whatever the number of cases (8 cases used to give 8 groups of one, 12 a note): numeric
    columns and the dataset's split are never default groups."""
    rows = "".join(f"c{i}\t{'a' if i % 2 else 'b'}\t{ga.format(20 + i * 1.7)}\ttest\n" for i in range(n_cases))
    a = assign_groups(write(tmp_path / "g.tsv", "case\tcondition\tga\tsplit\n" + rows), "case", None,
                      [f"c{i}" for i in range(n_cases)])
    assert a.column_names == ["condition"] and a.skipped_continuous_columns == ["ga", "split"]
    named = assign_groups(tmp_path / "g.tsv", "case", ["ga", "split"], [f"c{i}" for i in range(n_cases)])
    assert named.column_names == ["ga", "split"]  # named: the user's choice


@pytest.mark.parametrize("name,text,group_by,message", [
    ("g.csv", "case,condition\nc1,a\nc1,b\n", None, "duplicate rows for case"),
    ("g.csv", "case,condition\nc1,a,x,y\nc2,b\n", None, "malformed group table"),
    ("g.csv", "", None, "is empty"),
    ("g.csv", "case,condition\n", None, "no rows"),
    ("g.csv", "id,condition\nc1,a\n", None, "no case column 'case'"),
    ("g.tsv", "case\tcondition\nc1\ta\n", ["centre"], "no group column 'centre'"),
    ("g.tsv", "case\tga\nc1\tyoung\n", ["ga:19,25"], "non-numeric value 'young'"),
    ("g.txt", "case\tga\nc1\t1\n", None, "expected a .csv or .tsv"),
])
def test_bad_group_tables(tmp_path, name, text, group_by, message):
    with pytest.raises(UserError, match=message):
        assign_groups(write(tmp_path / name, text), "case", group_by, ["c1"])


def test_nnunet_summary_json_is_read(tmp_path):
    content = {"metric_per_case": [
        {"reference_file": "/gt/c1.nii.gz", "prediction_file": "/p/c1.nii.gz",
         "metrics": {"1": {"Dice": 0.5, "n_ref": 10, "n_pred": 6}, "(1, 2)": {"Dice": float("nan")}}}],
        "mean": {}, "foreground_mean": {}}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(content))
    summary = load_nnunet_summary(str(path))
    assert summary["c1"][frozenset({1})].dice == 0.5
    assert np.isnan(summary["c1"][frozenset({1, 2})].dice)
    path.write_text(json.dumps({"foo": 1}))
    with pytest.raises(UserError, match="not an nnU-Net summary.json"):
        load_nnunet_summary(str(path))


def test_evaluation_layer_imports_neither_training_nor_sampling():
    import ast
    import pathlib

    import nnunet_dro.evaluation as package
    for path in pathlib.Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("nnunet_dro.training", "nnunet_dro.sampling")), (path.name, name)


def test_docstring_examples_run():
    import doctest

    from nnunet_dro.evaluation import groups, io, metrics, regions, reports, stats
    for module in (groups, io, metrics, regions, reports, stats):
        failures, _ = doctest.testmod(module)
        assert failures == 0, module.__name__


def test_summary_json_input_policies_and_errors(tmp_path):
    from eval_testdata import write_label_map
    from nnunet_dro.evaluation import evaluate

    write_label_map(tmp_path / "ref" / "c1.nii.gz", np.zeros((2, 2, 2), np.uint8))
    write_label_map(tmp_path / "ref" / "c2.nii.gz", np.zeros((2, 2, 2), np.uint8))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"metric_per_case": [
        {"reference_file": "/gt/c1.nii.gz", "prediction_file": "/p/c1.nii.gz",
         "metrics": {"1": {"Dice": 0.5, "n_ref": 10, "n_pred": 30}, "2": {"Dice": float("nan"), "n_ref": 0,
                                                                          "n_pred": 0}}}]}))
    result = evaluate(str(tmp_path / "ref"), {"A": str(summary)}, None, metrics=["dice", "vs"], missing="worst",
                      progress=False)
    values = result.per_case.set_index(["case", "region", "metric"])["value"]
    assert values[("c1", "1", "dice")] == 50 and values[("c1", "1", "vs")] == 50
    assert values[("c1", "2", "dice")] == 100  # both empty, --empty one
    assert values[("c2", "1", "dice")] == 0  # missing from the summary, --missing worst
    with pytest.raises(UserError, match="no HD95"):
        evaluate(str(tmp_path / "ref"), {"A": str(summary)}, None, metrics=["hd95"], progress=False)
    with pytest.raises(UserError, match="has no result for region TC"):
        evaluate(str(tmp_path / "ref"), {"A": str(summary)}, None, regions="TC=1,2", missing="skip", progress=False)
