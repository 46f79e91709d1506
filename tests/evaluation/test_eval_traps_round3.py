"""Issue 80, evaluation part: a preset's NSD tolerance survives its check against dataset.json,
reference files of any ending, partly written cross-validation folds, one-slice 2D images,
qform/sform-different references and gap claims without an uncertainty (the real CLI on real
NIfTI files; expected values computed independently in the tests)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from eval_testdata import run_cli, write_label_map

PREFIX = "nnunet_dro evaluate: error: "
FETA7 = {"background": 0, "external_csf": 1, "grey_matter": 2, "white_matter": 3, "ventricles": 4,
         "cerebellum": 5, "deep_grey_matter": 6, "brainstem": 7}


def _messages(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines()
            if line.strip() and not line.lstrip().startswith(("Reading cases", "Report written to"))]


# --- item 1: a preset's NSD tolerance survives the dataset.json check, and is printed ----------

def _feta_dataset(root, spacing=(0.5, 0.5, 0.5)):
    """An nnU-Net FeTA dataset (0.5 mm voxels) whose predictions are the white matter shifted by
    3 voxels = 1.5 mm: NSD differs between 1 mm and 2 mm."""
    dataset = root / "Dataset201_FeTA"
    dataset.mkdir(parents=True)
    (dataset / "dataset.json").write_text(json.dumps({"channel_names": {"0": "T2"}, "labels": FETA7,
                                                      "numTraining": 2, "file_ending": ".nii.gz"}))
    for i in range(2):
        truth = np.zeros((20, 20, 20), np.uint8)
        for v in range(1, 8):
            truth[2 * v, 2:12, 2:12] = v
        truth[4:16, 4:16, 4:12] = 3
        pred = truth.copy()
        pred[4:16, 4:16, 4:12] = 0
        pred[4:16, 4:16, 4 + 3 + i:12 + 3 + i] = 3
        write_label_map(dataset / "labelsTr" / f"case_{i:03d}.nii.gz", truth, spacing=spacing)
        write_label_map(root / "pred" / f"case_{i:03d}.nii.gz", pred, spacing=spacing)
    return dataset / "labelsTr", root / "pred"


def test_feta_preset_checked_against_dataset_json_keeps_its_1mm_nsd_tolerance_and_prints_it(tmp_path):
    ref, pred = _feta_dataset(tmp_path)
    runs = {}
    for name, extra in (("preset", []), ("one", ["--nsd-tolerance", "1"]), ("two", ["--nsd-tolerance", "2"])):
        out = tmp_path / name
        done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "-regions", "feta",
                       "--metrics", "dice", "nsd", *extra)
        assert done.returncode == 0, done.stderr
        runs[name] = (done, out)
    done, out = runs["preset"]
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert "checked against" in settings["region_spec"]["source"]
    assert settings["nsd_tolerance_mm"] == 1.0 and settings["region_spec"]["nsd_tolerance_mm"] == 1.0

    def wm_nsd(folder):
        scores = pd.read_csv(folder / "per_case.csv")
        return scores[(scores["metric"] == "nsd") & (scores["region"] == "white_matter")]["value"].to_numpy()

    np.testing.assert_array_equal(wm_nsd(out), wm_nsd(runs["one"][1]))
    assert (wm_nsd(out) < wm_nsd(runs["two"][1])).all()  # the 2 mm fallback of the issue reads higher
    # printed where the reader looks, not only in summary.json
    assert "NSD tolerance: 1 mm." in done.stdout
    assert "NSD tolerance: 1 mm." in (out / "table.md").read_text()
    assert "NSD tolerance: 1 mm." in (out / "table.tex").read_text()
    assert "NSD tolerance: 2 mm." in runs["two"][0].stdout
    # without nsd among the metrics no tolerance is claimed
    plain = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", tmp_path / "dice", "-np", "1", "-regions", "feta")
    assert plain.returncode == 0, plain.stderr
    assert "NSD tolerance" not in plain.stdout


# --- item 2: the reference set is every label file, whatever its ending ---------------------------

def _gunzip(path):
    """``case.nii.gz`` -> ``case.nii`` (the same image, uncompressed), as a user who unpacked a few."""
    import gzip
    import shutil
    target = path.with_name(path.name[:-len(".gz")])
    with gzip.open(path, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return target


def _ending_world(root, n=6):
    dataset = root / "Dataset202_E"
    dataset.mkdir(parents=True)
    (dataset / "dataset.json").write_text(json.dumps({"channel_names": {"0": "T2"},
                                                      "labels": {"background": 0, "a": 1},
                                                      "numTraining": n, "file_ending": ".nii.gz"}))
    rng = np.random.default_rng(3)
    for i in range(n):
        truth = np.zeros((6, 8, 8), np.uint8)
        truth[1:5, 2:6, 2:2 + 1 + i % 4] = 1
        pred = truth.copy()
        pred[rng.random(pred.shape) < 0.1] = 0
        write_label_map(dataset / "labelsTr" / f"case_{i:03d}.nii.gz", truth)
        write_label_map(root / "pred" / f"case_{i:03d}.nii.gz", pred)
    return dataset / "labelsTr", root / "pred"


def test_references_saved_as_nii_beside_dataset_json_nii_gz_are_one_line_not_dropped(tmp_path):
    ref, pred = _ending_world(tmp_path)
    for i in (1, 4):
        _gunzip(ref / f"case_{i:03d}.nii.gz")
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1")
    assert done.returncode == 2, done.stdout
    assert _messages(done.stderr) == [
        f"{PREFIX}reference folder {ref}: 2 of 6 label files end in .nii, not in .nii.gz as the dataset.json of "
        f"the references says (e.g. case_001.nii); nnU-Net reads only .nii.gz: write every file as .nii.gz"]
    assert not out.exists()


def test_mixed_prediction_endings_are_one_line_naming_the_prediction_folder(tmp_path):
    ref, pred = _ending_world(tmp_path)
    _gunzip(pred / "case_002.nii.gz")
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "--missing", "skip")
    assert done.returncode == 2, done.stdout
    (line,) = _messages(done.stderr)
    assert line.startswith(f"{PREFIX}prediction folder of A {pred}: 1 of 6 label files end in .nii, not in .nii.gz")
    assert "--missing" not in line and not out.exists()


def test_mixed_endings_without_dataset_json_are_all_read(tmp_path):
    """Without a dataset.json no ending is prescribed: .nii, .nii.gz and .mha references are all
    cases, matched to predictions of another ending by case identifier, with the same scores."""
    import SimpleITK as sitk
    ref, pred = _ending_world(tmp_path)
    (ref.parent / "dataset.json").unlink()
    out_gz = tmp_path / "all_gz"
    assert run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out_gz, "-np", "1").returncode == 0
    _gunzip(ref / "case_001.nii.gz")
    mha = ref / "case_003.nii.gz"
    sitk.WriteImage(sitk.ReadImage(str(mha)), str(ref / "case_003.mha"))
    mha.unlink()
    _gunzip(pred / "case_004.nii.gz")
    out = tmp_path / "mixed"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1")
    assert done.returncode == 0, done.stderr
    a, b = pd.read_csv(out_gz / "per_case.csv"), pd.read_csv(out / "per_case.csv")
    assert sorted(b["case"].unique()) == [f"case_{i:03d}" for i in range(6)]
    np.testing.assert_array_equal(a["value"], b["value"])


# --- item 3: every fold is compared with splits_final.json before scoring ------------------------

def _cv_world(tmp_path, monkeypatch, splits=True):
    from test_eval_crossval import CASES, FOLD_OF, make_world
    raw, folders = make_world(tmp_path, trainers=("nnUNetTrainer__nnUNetPlans__3d_fullres",
                                                  "nnUNetTrainerDRO__nnUNetPlans__3d_fullres"))
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    monkeypatch.delenv("nnUNet_preprocessed", raising=False)
    if splits:
        content = [{"train": [c for c in CASES if FOLD_OF[c] != f], "val": [c for c in CASES if FOLD_OF[c] == f]}
                   for f in (0, 1)]
        for folder in folders.values():
            (folder / "splits_final.json").write_text(json.dumps(content))
    return raw, list(folders.values())


@pytest.mark.parametrize("folds", [[], ["--folds", "1"]])
def test_partly_written_fold_is_named_against_splits_final_json(tmp_path, monkeypatch, folds):
    raw, (erm, dro) = _cv_world(tmp_path, monkeypatch)
    (dro / "fold_1" / "validation" / "case_004.nii.gz").unlink()  # fold 1 still exporting
    out = tmp_path / "report"
    done = run_cli("-pred", f"ERM={erm}", f"DRO={dro}", "-o", out, "-np", "1", *folds)
    assert done.returncode == 2, done.stdout
    (line,) = _messages(done.stderr)
    hint = " or evaluate the complete folds only with --folds 0" if not folds else ""
    assert line == (f"{PREFIX}-pred DRO={dro}: fold_1/validation holds 2 of the 3 cases that "
                    f"{dro / 'splits_final.json'} validates in fold 1; no prediction for case_004 (is fold 1 "
                    f"finished? its validation is written at the end of its training{hint})")
    assert "--missing" not in line and not out.exists()
    if not folds:  # the option suggested exists and scores the complete folds, every case of them
        done = run_cli("-pred", f"ERM={erm}", f"DRO={dro}", "-o", out, "-np", "1", "--folds", "0")
        assert done.returncode == 0, done.stderr
        assert sorted(set(pd.read_csv(out / "per_case.csv")["case"])) == ["case_000", "case_001", "case_002"]


def test_unwritten_cross_validation_case_without_splits_offers_no_missing_option(tmp_path, monkeypatch):
    """No splits_final.json: the case is still named, but neither --missing worst (Dice 0 for a
    file never written) nor --folds (which would drop it) is suggested; with --folds a note says
    that completeness could not be checked."""
    raw, (erm, dro) = _cv_world(tmp_path, monkeypatch, splits=False)
    (dro / "fold_1" / "validation" / "case_004.nii.gz").unlink()
    out = tmp_path / "report"
    done = run_cli("-pred", f"ERM={erm}", f"DRO={dro}", "-o", out, "-np", "1")
    assert done.returncode == 2
    (line,) = _messages(done.stderr)
    assert line == (f"{PREFIX}DRO has no prediction for 1 case(s) in the validation of fold 0, 1 (is every fold "
                    f"finished? a fold's validation is written at the end of its training): case_004")
    done = run_cli("-pred", f"DRO={dro}", "-o", out, "-np", "1", "--folds", "1")
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == [
        f"note: DRO: no splits_final.json in the trainer folder or $nnUNet_preprocessed/Dataset201_FeTA3, so nothing "
        f"tells whether fold(s) 1 hold every case they validate; DRO = fold_N/validation of {dro.name}, fold 1 "
        f"(2 cases)"]


# --- item 4: surfaces over the image's real dimensions (a 2D case as one slice) -------------------

def _edges(mask):
    """MONAI's ``get_mask_edges`` (no subvoxels): the mask minus its erosion by the face-connected
    structure, outside the image counting as background."""
    from scipy import ndimage
    return mask & ~ndimage.binary_erosion(mask, border_value=0)


def _monai_2d(ref, pred, spacing, tolerance):
    """HD95 and NSD as MONAI computes them in 2D (``compute_hausdorff_distance(percentile=95)``,
    ``compute_surface_dice(use_subvoxels=False)``), written here with scipy's distance transform:
    MONAI is not a dependency of this project."""
    from scipy import ndimage
    ref_edge, pred_edge = _edges(ref), _edges(pred)
    to_pred = ndimage.distance_transform_edt(~pred_edge, sampling=spacing)[ref_edge]
    to_ref = ndimage.distance_transform_edt(~ref_edge, sampling=spacing)[pred_edge]
    hd95 = max(np.percentile(to_pred, 95), np.percentile(to_ref, 95))
    nsd = 100.0 * ((to_pred <= tolerance).sum() + (to_ref <= tolerance).sum()) / (to_pred.size + to_ref.size)
    return hd95, nsd


def _two_d_case():
    yy, xx = np.mgrid[:40, :48]
    ref = ((yy - 20) ** 2 / 14 ** 2 + (xx - 22) ** 2 / 16 ** 2) <= 1
    pred = ((yy - 23) ** 2 / 11 ** 2 + (xx - 26) ** 2 / 17 ** 2) <= 1
    pred[5:9, 30:38] = True  # a false positive island: HD95 is not a one-pixel matter
    return ref, pred


def _scores(folder):
    scores = pd.read_csv(folder / "per_case.csv").set_index("metric")["value"]
    return scores["hd95"], scores["nsd"]


@pytest.mark.parametrize("spacing", [(1.0, 1.0), (0.6, 0.8)])  # (y, x) in mm
def test_one_slice_nifti_scores_hd95_and_nsd_as_2d(tmp_path, spacing):
    ref, pred = _two_d_case()
    for name, mask in (("ref", ref), ("pred", pred)):
        # (1, y, x): one slice of 3 mm; SimpleITK spacing order is (x, y, z)
        write_label_map(tmp_path / name / "case_000.nii.gz", mask[None].astype(np.uint8),
                        spacing=(spacing[1], spacing[0], 3.0))
    out = tmp_path / "report"
    done = run_cli("-ref", tmp_path / "ref", "-pred", f"A={tmp_path / 'pred'}", "-o", out, "-np", "1",
                   "--metrics", "dice", "hd95", "nsd", "--nsd-tolerance", "2")
    assert done.returncode == 0, done.stderr
    hd95, nsd = _scores(out)
    expected_hd95, expected_nsd = _monai_2d(ref, pred, spacing, 2.0)
    assert hd95 == pytest.approx(expected_hd95, abs=1e-6)
    assert nsd == pytest.approx(expected_nsd, abs=1e-6)
    assert expected_nsd < 90  # far from the ring of the issue (every pixel surface: NSD 92.5)


def test_one_slice_nifti_and_png_give_the_same_2d_scores(tmp_path):
    from PIL import Image
    ref, pred = _two_d_case()
    for name, mask in (("ref", ref), ("pred", pred)):
        write_label_map(tmp_path / f"nii_{name}" / "case_000.nii.gz", mask[None].astype(np.uint8))
        (tmp_path / f"png_{name}").mkdir()
        Image.fromarray(mask.astype(np.uint8)).save(tmp_path / f"png_{name}" / "case_000.png")
    results = {}
    for kind in ("nii", "png"):
        out = tmp_path / f"report_{kind}"
        done = run_cli("-ref", tmp_path / f"{kind}_ref", "-pred", f"A={tmp_path / f'{kind}_pred'}", "-o", out,
                       "-np", "1", "--metrics", "dice", "hd95", "nsd", "--nsd-tolerance", "2")
        assert done.returncode == 0, done.stderr
        results[kind] = _scores(out)
    assert results["nii"] == pytest.approx(results["png"], abs=1e-9)
    assert results["png"] == pytest.approx(_monai_2d(ref, pred, (1.0, 1.0), 2.0), abs=1e-6)


# --- item 5: NIfTI geometry as nnU-Net reads it (SimpleITK's choice between qform and sform) -------

def test_reference_with_different_qform_and_sform_is_read_as_nnunet_reads_it(tmp_path):
    """A reference whose sform (code 2, aligned) differs from its qform: nibabel's affine is the
    sform, SimpleITK's (nnU-Net's) geometry the qform. nnU-Net writes its prediction with
    SimpleITK's geometry; that pair is valid (nnU-Net scores it Dice 1.0) and was refused as an
    origin mismatch."""
    import nibabel
    import SimpleITK as sitk
    truth = np.zeros((10, 12, 8), np.uint8)  # nibabel order (i, j, k)
    truth[2:7, 3:9, 2:6] = 1
    qform = np.diag([1.0, 1.0, 2.0, 1.0])
    qform[:3, 3] = (-5.0, -6.0, -8.0)
    sform = qform.copy()
    sform[:3, 3] = (12.5, -30.0, 40.0)  # a registration to another space, kept in the sform
    image = nibabel.Nifti1Image(truth, sform)
    image.set_qform(qform, code=1)
    image.set_sform(sform, code=2)
    (tmp_path / "ref").mkdir()
    nibabel.save(image, tmp_path / "ref" / "case_000.nii.gz")
    reference = sitk.ReadImage(str(tmp_path / "ref" / "case_000.nii.gz"))
    # nnU-Net's SimpleITKIO writes the prediction with the geometry it read
    prediction = sitk.GetImageFromArray(sitk.GetArrayFromImage(reference))
    prediction.CopyInformation(reference)
    (tmp_path / "pred").mkdir()
    sitk.WriteImage(prediction, str(tmp_path / "pred" / "case_000.nii.gz"), True)
    out = tmp_path / "report"
    done = run_cli("-ref", tmp_path / "ref", "-pred", f"A={tmp_path / 'pred'}", "-o", out, "-np", "1")
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(out / "per_case.csv")["value"].tolist() == [100.0]

    from nnunet_dro.evaluation.io import read_segmentation
    array, geometry = read_segmentation(str(tmp_path / "ref" / "case_000.nii.gz"))
    np.testing.assert_array_equal(array, sitk.GetArrayFromImage(reference))
    np.testing.assert_allclose(geometry.origin, reference.GetOrigin())
    np.testing.assert_allclose(geometry.direction, reference.GetDirection())
    np.testing.assert_allclose(geometry.spacing, reference.GetSpacing()[::-1])
    # a prediction really elsewhere (its own origin 10 mm away) is still refused
    moved = sitk.Image(prediction)
    moved.SetOrigin(tuple(np.add(reference.GetOrigin(), (10.0, 0.0, 0.0))))
    sitk.WriteImage(moved, str(tmp_path / "pred" / "case_000.nii.gz"), True)
    done = run_cli("-ref", tmp_path / "ref", "-pred", f"A={tmp_path / 'pred'}", "-o", tmp_path / "r2", "-np", "1")
    assert done.returncode == 2 and "origin mismatch" in done.stderr


# --- item 9: a gap claim carries an uncertainty, or is worded without a claim -------------------

def test_gap_line_without_bootstrap_makes_no_claim_and_with_bootstrap_gives_the_interval(tmp_path):
    """Two groups of 4 cases; DRO's gap is a little smaller. Bootstrap off (the default): the line
    states the difference and says it has no interval, never "DRO shrank it"."""
    rows = ["case\tcondition"]
    removed = {"ERM": {"a": [0, 1, 0, 1], "b": [2, 3, 2, 3]}, "DRO": {"a": [0, 1, 0, 1], "b": [2, 2, 2, 3]}}
    for group in ("a", "b"):
        for i in range(4):
            rows.append(f"{group}{i}\t{group}")
            ref = np.zeros((12, 12, 12), np.uint8)
            ref[2:10, 2:10, 2:10] = 1
            write_label_map(tmp_path / "ref" / f"{group}{i}.nii.gz", ref)
            for method, slabs in removed.items():
                pred = ref.copy()
                if slabs[group][i]:
                    pred[10 - slabs[group][i]:10] = 0
                write_label_map(tmp_path / method / f"{group}{i}.nii.gz", pred)
    (tmp_path / "groups.tsv").write_text("\n".join(rows) + "\n")
    common = ["-ref", tmp_path / "ref", "-pred", f"ERM={tmp_path / 'ERM'}", f"DRO={tmp_path / 'DRO'}", "-np", "1",
              "-groups", tmp_path / "groups.tsv"]
    done = run_cli(*common, "-o", tmp_path / "plain")
    assert done.returncode == 0, done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("Gap by condition"))
    gap = pd.read_csv(tmp_path / "plain" / "disparity.csv").set_index("method").loc["DRO", "gap_change"]
    assert gap < 0
    assert "shrank" not in line, line
    assert f"1: DRO's gap {-gap:.1f} smaller on these cases, no interval (--bootstrap N tells whether it is " \
           f"more than chance; Δ gap {gap:+.1f}; ERM gap" in line, line
    done = run_cli(*common, "-o", tmp_path / "boot", "--bootstrap", "500")
    assert done.returncode == 0, done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("Gap by condition"))
    assert "no interval" not in line and f"Δ gap {gap:+.1f} [" in line, line


# --- item 13: small ones ---------------------------------------------------------------------------

def _small_cohort(root, n=6, values=(1, 2)):
    """Cases with labels ``values``; label 2 is absent from reference and prediction of case_000."""
    for i in range(n):
        truth = np.zeros((8, 10, 10), np.uint8)
        truth[2:6, 2:7, 2:2 + 3 + i % 3] = 1
        if i:
            truth[1:3, 7:9, 6:9] = 2
        pred = np.roll(truth, i % 2, axis=1)
        write_label_map(root / "ref" / f"case_{i:03d}.nii.gz", truth)
        write_label_map(root / "pred" / f"case_{i:03d}.nii.gz", pred)
    return root / "ref", root / "pred"


def test_empty_note_says_the_value_each_metric_was_given(tmp_path):
    ref, pred = _small_cohort(tmp_path)
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "--metrics", "dice", "hd95", "nsd",
                   "euler", "-regions", "a=1;b=2")
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out / "per_case.csv", keep_default_na=False)
    empty = rows[(rows["case"] == "case_000") & (rows["region"] == "b")].set_index("metric")
    assert empty.loc["dice", "note"] == "empty in reference and prediction: scored 100 (--empty one)"
    assert empty.loc["nsd", "note"] == "empty in reference and prediction: scored 100 (--empty one)"
    for metric in ("hd95", "euler"):
        assert float(empty.loc[metric, "value"]) == 0.0
        assert empty.loc[metric, "note"] == "empty in reference and prediction: scored 0 (--empty one)"


def test_geometry_mismatch_prints_shape_and_spacing_in_the_order_of_origin(tmp_path):
    truth = np.zeros((4, 6, 8), np.uint8)  # numpy (z, y, x): x = 8, y = 6, z = 4
    truth[1:3, 1:4, 1:6] = 1
    write_label_map(tmp_path / "ref" / "case_000.nii.gz", truth, spacing=(0.5, 0.8, 3.0))
    write_label_map(tmp_path / "pred" / "case_000.nii.gz", truth, spacing=(0.5, 0.8, 2.0))
    write_label_map(tmp_path / "pred2" / "case_000.nii.gz", truth[:, :, :7], spacing=(0.5, 0.8, 3.0))
    done = run_cli("-ref", tmp_path / "ref", "-pred", f"A={tmp_path / 'pred'}", "-o", tmp_path / "r", "-np", "1")
    assert done.returncode == 2
    assert _messages(done.stderr) == [f"{PREFIX}case 'case_000' (method A): spacing mismatch (x, y, z), reference "
                                      f"(0.5, 0.8, 3) vs prediction (0.5, 0.8, 2)"]
    done = run_cli("-ref", tmp_path / "ref", "-pred", f"A={tmp_path / 'pred2'}", "-o", tmp_path / "r", "-np", "1")
    assert _messages(done.stderr) == [f"{PREFIX}case 'case_000' (method A): shape mismatch (x, y, z), reference "
                                      f"(8, 6, 4) vs prediction (7, 6, 4)"]


def test_missing_value_markers_in_the_group_table_are_no_group_and_said(tmp_path):
    ref, pred = _small_cohort(tmp_path)
    (tmp_path / "groups.tsv").write_text("case\tsite\n" + "".join(
        f"case_{i:03d}\t{v}\n" for i, v in enumerate(["A", "B", "nan", "None", "-", "A"])))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "1", "-groups", tmp_path / "groups.tsv")
    assert done.returncode == 0, done.stderr
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    assert sorted(set(summary.loc[summary["group_column"] == "site", "group"])) == ["A", "B"]
    assert _messages(done.stderr) == ["note: 3 case(s) have no value in column 'site' ('nan', 'None', '-' read as "
                                      "no value), counted in 'all' only: case_002, case_003, case_004"]


def test_every_group_tied_names_no_best_and_no_worst_group(tmp_path):
    from nnunet_dro.evaluation.disparity import gap_statistics
    stats = gap_statistics({"control": np.array([100.0, 100.0]), "case": np.array([100.0])}, True, True)
    assert stats["best_group"] == stats["worst_group"] == "(all groups tie)" and stats["gap"] == 0.0
    ref, pred = _small_cohort(tmp_path)
    (tmp_path / "groups.tsv").write_text("case\tsite\n" + "".join(
        f"case_{i:03d}\t{'AB'[i % 2]}\n" for i in range(6)))
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={ref}", "-o", out, "-np", "1", "-groups", tmp_path / "groups.tsv")
    assert done.returncode == 0, done.stderr
    assert "control" not in done.stdout
    assert "| (all groups tie) (100.0) | (all groups tie) (100.0) |" in (out / "table.md").read_text()


def test_prediction_folder_that_is_the_reference_folder_is_said(tmp_path):
    ref, pred = _small_cohort(tmp_path)
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={pred}", f"B={ref}", "-o", out, "-np", "1")
    assert done.returncode == 0, done.stderr
    assert _messages(done.stderr) == [f"warning: -pred B={ref} is the reference folder itself: every case is scored "
                                      f"against itself (Dice 100, HD95 0)"]


def test_gap_labels_stay_inside_their_panels(tmp_path):
    """A gap bracket near the top of a panel (Dice near 100) had its label cut off by the panel's edge."""
    from nnunet_dro.evaluation import evaluate
    from nnunet_dro.evaluation.reports import disparity_figure
    ref, pred = _small_cohort(tmp_path, n=8)
    (tmp_path / "groups.tsv").write_text("case\tsite\n" + "".join(
        f"case_{i:03d}\t{'AB'[i // 4]}\n" for i in range(8)))
    result = evaluate(str(ref), {"ERM": str(pred), "DRO": str(ref)}, None, groups=str(tmp_path / "groups.tsv"),
                      num_processes=1, progress=False, echo=lambda text: None)
    figure = disparity_figure(result, "dice")
    renderer = figure.canvas.get_renderer()
    figure.canvas.draw()
    labels = [(axis, text) for axis in figure.axes for text in axis.texts if text.get_text().startswith("gap ")]
    assert labels
    for axis, text in labels:
        box, panel = text.get_window_extent(renderer), axis.get_window_extent(renderer)
        assert panel.y0 <= box.y0 and box.y1 <= panel.y1, (text.get_text(), box, panel)
