"""Regions never silently wrong: the dataset.json beside the reference folder gives the default
regions (named as there), a preset must fit it, and a region absent from every reference is an
error unless ``--allow-mismatch`` (the real CLI on tiny nnU-Net datasets, and the rules as tables)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from eval_testdata import run_cli, write_label_map
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.regions import PRESETS, Region, RegionSpec, parse_regions, preset_mismatches, resolve_regions

PREFIX = "nnunet_dro evaluate: error: "
FETA7 = {"background": 0, "external_csf": 1, "grey_matter": 2, "white_matter": 3, "ventricles": 4,
         "cerebellum": 5, "deep_grey_matter": 6, "brainstem": 7}
FETA3 = {"background": 0, "white_matter": 1, "intra_axial_csf": 2, "cerebellum": 3}  # convert-feta --three-regions
BRATS_REGIONS = {"background": 0, "whole_tumor": [1, 2, 3], "tumor_core": [2, 3], "enhancing_tumor": [3]}


def make_dataset(root, labels: dict, values, n_cases=3, split="labelsTs", regions_class_order=None):
    """``root/Dataset201_X/{dataset.json, <split>/case_*.nii.gz}`` and a prediction folder
    ``root/pred`` (each label box shifted by one voxel). Returns (reference folder, prediction folder)."""
    dataset = root / "Dataset201_X"
    content = {"channel_names": {"0": "T2"}, "labels": labels, "numTraining": n_cases, "file_ending": ".nii.gz"}
    if regions_class_order:
        content["regions_class_order"] = regions_class_order
    dataset.mkdir(parents=True, exist_ok=True)
    (dataset / "dataset.json").write_text(json.dumps(content))
    for i in range(n_cases):
        truth = np.zeros((8, 8, 8), np.uint8)
        for k, v in enumerate(values):
            truth[k, 1:6, 1:6] = v
        write_label_map(dataset / split / f"case_{i:03d}.nii.gz", truth)
        write_label_map(root / "pred" / f"case_{i:03d}.nii.gz", np.roll(truth, 1, axis=2))
    return dataset / split, root / "pred"


def _messages(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines()
            if line.strip() and not line.lstrip().startswith(("Reading cases", "Report written to"))]


# --- the rules, as a table ---------------------------------------------------------------------

def _spec(labels: dict) -> RegionSpec:
    regions = tuple(Region(n, tuple(v) if isinstance(v, list) else (v,)) for n, v in labels.items() if n != "background")
    declared = frozenset({0} | {x for r in regions for x in r.labels})
    return RegionSpec("dataset", regions, declared)


@pytest.mark.parametrize("preset, labels, expected", [
    ("feta", FETA7, []),  # the full FeTA labels: the preset scores 3, 4, 5 of them
    ("feta", FETA3, ["labels 4,5 are not in the dataset",
                     "names for other labels: white_matter is 1 there, 3 in the preset, intra_axial_csf is 2 there, "
                     "4 in the preset, cerebellum is 3 there, 5 in the preset"]),
    ("feta", {**FETA7, "hypothalamus": 8}, ["dataset label 8 is unknown to the preset"]),
    ("brats", BRATS_REGIONS, ["label 4 is not in the dataset", "dataset label 3 is unknown to the preset"]),
    ("brats-nnunet", BRATS_REGIONS, []),
    ("brats-nnunet", {"background": 0, "edema": 1, "necrosis": 2, "enhancing": 3}, []),
    ("brats", {"background": 0, "necrosis": 1, "edema": 2, "enhancing": 4}, []),
    ("brats-nnunet", {"background": 0, "necrosis": 1, "edema": 2, "enhancing": 4},
     ["label 3 is not in the dataset", "dataset label 4 is unknown to the preset"]),
])
def test_preset_against_dataset_labels(preset, labels, expected):
    assert preset_mismatches(PRESETS[preset], _spec(labels)) == expected


def test_resolve_regions_without_dataset_json_is_parse_regions(tmp_path):
    (tmp_path / "labelsTs").mkdir()
    assert resolve_regions("feta", str(tmp_path / "labelsTs")) == PRESETS["feta"]
    assert resolve_regions(None, str(tmp_path / "labelsTs")) == parse_regions(None)


def test_resolve_regions_default_and_ignore_label(tmp_path):
    (tmp_path / "labelsTr").mkdir()
    (tmp_path / "dataset.json").write_text(json.dumps({"labels": {**FETA7, "ignore": 8}, "file_ending": ".nii.gz"}))
    spec = resolve_regions(None, str(tmp_path / "labelsTr"))
    assert [r.name for r in spec.regions] == list(FETA7)[1:] and spec.ignore_label == 8
    assert spec.source.startswith("default: dataset.json")
    fitted = resolve_regions("feta", str(tmp_path / "labelsTr"))
    assert fitted.regions == PRESETS["feta"].regions and fitted.ignore_label == 8  # the ignore label is not a misfit
    inline = resolve_regions("WM=3", str(tmp_path / "labelsTr"))
    # an inline list is the user's own choice of labels (a subset is fine), checked for names only
    assert inline.regions == parse_regions("WM=3").regions and inline.ignore_label == 8
    with pytest.raises(UserError, match=r"^-regions white_matter=5;cerebellum=3 does not fit the dataset of the "
                                        r"references: the list has white_matter=5, cerebellum=3, .* names for other "
                                        r"labels: white_matter is 3 there, 5 in the list, cerebellum is 5 there, 3 "
                                        r"in the list"):
        resolve_regions("white_matter=5;cerebellum=3", str(tmp_path / "labelsTr"))
    with pytest.raises(UserError, match=r"Cerebellum is 5 there, 4 in the list"):  # case and punctuation
        resolve_regions("Cerebellum=4", str(tmp_path / "labelsTr"))
    with pytest.raises(UserError, match=r"label 9 is not in the dataset"):
        resolve_regions("extra=9", str(tmp_path / "labelsTr"))


def test_misfit_is_an_error_or_with_allow_mismatch_a_warning(tmp_path):
    (tmp_path / "labelsTs").mkdir()
    (tmp_path / "dataset.json").write_text(json.dumps({"labels": FETA3}))
    with pytest.raises(UserError, match=r"^-regions feta does not fit the dataset of the references: the preset has "
                                        r"white_matter=3, intra_axial_csf=4, cerebellum=5; values 0-7, .*dataset.json "
                                        r"has white_matter=1, intra_axial_csf=2, cerebellum=3: labels 4,5 are not"):
        resolve_regions("feta", str(tmp_path / "labelsTs"))
    warnings = []
    spec = resolve_regions("feta", str(tmp_path / "labelsTs"), strict=False, warn=warnings.append)
    assert spec == PRESETS["feta"] and len(warnings) == 1 and warnings[0].startswith("warning: -regions feta does not")


# --- the real CLI --------------------------------------------------------------------------------

def test_default_regions_are_the_dataset_labels_by_name(tmp_path):
    ref, pred = make_dataset(tmp_path, FETA3, values=(1, 2, 3))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1")
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == []
    scores = pd.read_csv(out / "per_case.csv")
    assert list(dict.fromkeys(scores["region"])) == ["white_matter", "intra_axial_csf", "cerebellum"]
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["regions"] == {"white_matter": [1], "intra_axial_csf": [2], "cerebellum": [3]}
    assert "dataset.json" in settings["region_spec"]["source"]
    assert "| all | A | white_matter |" in done.stdout


def test_region_based_dataset_defaults_to_its_regions(tmp_path):
    ref, pred = make_dataset(tmp_path, BRATS_REGIONS, values=(1, 2, 3), regions_class_order=[1, 2, 3])
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1")
    assert done.returncode == 0, done.stderr
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["regions"] == {"whole_tumor": [1, 2, 3], "tumor_core": [2, 3], "enhancing_tumor": [3]}
    # the same as naming the dataset.json, and as the fitting preset under its names
    named = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r2", "-np", "1",
                    "-regions", ref.parent / "dataset.json")
    assert named.returncode == 0, named.stderr
    a, b = pd.read_csv(out / "per_case.csv"), pd.read_csv(tmp_path / "r2" / "per_case.csv")
    np.testing.assert_array_equal(a["value"], b["value"])
    preset = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r3", "-np", "1", "-regions", "brats-nnunet")
    assert preset.returncode == 0, preset.stderr
    c = pd.read_csv(tmp_path / "r3" / "per_case.csv").set_index("region")["value"]
    np.testing.assert_array_equal(c.loc["WT"], a.set_index("region")["value"].loc["whole_tumor"])


def test_feta_preset_on_three_region_dataset_stops(tmp_path):
    """The trap of the issue: exit 0, two absent regions at Dice 100 and label 3 called white_matter."""
    ref, pred = make_dataset(tmp_path, FETA3, values=(1, 2, 3))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "-regions", "feta")
    assert done.returncode == 2, done.stderr
    (line,) = _messages(done.stderr)
    assert line.startswith(f"{PREFIX}-regions feta does not fit the dataset of the references: the preset has "
                           f"white_matter=3, intra_axial_csf=4, cerebellum=5; values 0-7, ")
    assert f"{ref.parent / 'dataset.json'} has white_matter=1, intra_axial_csf=2, cerebellum=3: labels 4,5 are " \
           f"not in the dataset; names for other labels: white_matter is 1 there, 3 in the preset" in line
    assert line.endswith("Leave -regions out to use the dataset's own labels (or pass --allow-mismatch to go on)")
    assert not out.exists()


def test_feta_preset_on_three_region_dataset_with_allow_mismatch(tmp_path):
    ref, pred = make_dataset(tmp_path, FETA3, values=(1, 2, 3))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "-regions", "feta", "--allow-mismatch")
    assert done.returncode == 0, done.stderr
    lines = _messages(done.stderr)
    assert len(lines) == 2 and lines[0].startswith("warning: -regions feta does not fit the dataset")
    assert lines[1].startswith("warning: regions intra_axial_csf (label 4); cerebellum (label 5) occur in no "
                               "reference file (labels found: 1,2,3)")


def test_feta_preset_on_the_full_feta_labels_runs(tmp_path):
    ref, pred = make_dataset(tmp_path, FETA7, values=(1, 2, 3, 4, 5, 6, 7))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "-regions", "feta")
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == []
    assert list(dict.fromkeys(pd.read_csv(out / "per_case.csv")["region"])) == \
        ["white_matter", "intra_axial_csf", "cerebellum"]


def test_brats_preset_on_nnunet_brats_dataset_stops(tmp_path):
    ref, pred = make_dataset(tmp_path, BRATS_REGIONS, values=(1, 2, 3), regions_class_order=[1, 2, 3])
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r", "-np", "1", "-regions", "brats")
    assert done.returncode == 2
    (line,) = _messages(done.stderr)
    assert "the preset has ET=4, TC=1+4, WT=1+2+4; values 0,1,2,4" in line
    assert "has whole_tumor=1+2+3, tumor_core=2+3, enhancing_tumor=3: label 4 is not in the dataset; dataset " \
           "label 3 is unknown to the preset" in line


def test_dataset_label_absent_from_every_reference_is_an_error_by_default(tmp_path):
    """The default regions come from dataset.json: a label no reference holds is an error (strict is
    the default), a warning with --allow-mismatch."""
    ref, pred = make_dataset(tmp_path, FETA3, values=(1, 2))
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r", "-np", "1")
    assert done.returncode == 2
    assert _messages(done.stderr) == [
        f"{PREFIX}region cerebellum (label 3) occurs in no reference file (labels found: 1,2); check -regions "
        f"(or pass --allow-mismatch to go on with a warning)"]
    assert not (tmp_path / "r").exists()
    allowed = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r", "-np", "1", "--allow-mismatch")
    assert allowed.returncode == 0, allowed.stderr
    assert _messages(allowed.stderr)[0].startswith("warning: region cerebellum (label 3) occurs in no reference file")


def test_strict_and_allow_mismatch_exclude_each_other(tmp_path):
    ref, pred = make_dataset(tmp_path, FETA3, values=(1, 2, 3))
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "r", "--strict", "--allow-mismatch")
    assert done.returncode == 2
    assert "not allowed with argument" in done.stderr.strip().splitlines()[-1]
