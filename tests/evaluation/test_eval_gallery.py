"""The gallery of worst cases (``worst_<metric>.png``) and ``report.html`` of ``nnunet_dro evaluate``:
which cases, which slice, which plane, the images found beside the references or given with ``-i``,
2D cases, and the self-contained page (figures embedded, no script, no network)."""
from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from eval_testdata import run_cli, write_label_map
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation import evaluate
from nnunet_dro.evaluation.gallery import (
    PREDICTION_COLOUR,
    REFERENCE_COLOUR,
    GallerySource,
    _case_panels,
    list_images,
    plane_axis,
    worst_cases,
    worst_slice,
)

SHAPE = (6, 20, 20)  # numpy order z, y, x; z is the thick axis (3 mm) in the cohort below


def _truth(rng) -> np.ndarray:
    truth = np.zeros(SHAPE, np.uint8)
    z0, y0, x0 = 1, int(rng.integers(3, 7)), int(rng.integers(3, 7))
    truth[z0:z0 + 4, y0:y0 + 9, x0:x0 + 9] = 1
    truth[z0 + 1:z0 + 3, y0 + 3:y0 + 6, x0 + 3:x0 + 6] = 2
    return truth


def _image(rng, truth) -> np.ndarray:
    """Bright where the reference is foreground: a panel cut from the wrong place or axis shows it."""
    return (100.0 * (truth > 0) + rng.normal(0, 3, truth.shape)).astype(np.float32)


def make_dataset(root: Path, n_cases: int = 6, spacing=(0.8, 0.8, 3.0), images: bool = True, seed: int = 0):
    """labelsTs, imagesTs (CASE_0000), one prediction folder and a group table under ``root``.

    Case ``c003`` is planted worst: its prediction misses the label-1 box on slice 2 only."""
    rng = np.random.default_rng(seed)
    labels, image_folder, pred = root / "labelsTs", root / "imagesTs", root / "pred"
    rows = []
    for i in range(n_cases):
        case = f"c{i:03d}"
        truth = _truth(rng)
        prediction = truth.copy()
        flips = rng.random(SHAPE) < 0.01
        prediction[flips] = 0
        if case == "c003":
            prediction[2][truth[2] == 1] = 0
        write_label_map(labels / f"{case}.nii.gz", truth, spacing=spacing)
        write_label_map(pred / f"{case}.nii.gz", prediction, spacing=spacing)
        if images:
            write_label_map(image_folder / f"{case}_0000.nii.gz", _image(rng, truth), spacing=spacing)
        rows.append((case, "young" if i % 2 else "old"))
    pd.DataFrame(rows, columns=["case", "age"]).to_csv(root / "groups.tsv", sep="\t", index=False)
    return labels, pred


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("gallery")
    labels, pred = make_dataset(root)
    return root, labels, pred


@pytest.fixture(scope="module")
def report(dataset, tmp_path_factory):
    root, labels, pred = dataset
    out = tmp_path_factory.mktemp("report") / "out"
    result = evaluate(str(labels), {"M": str(pred)}, str(out), groups=str(root / "groups.tsv"), group_by=["age"],
                      metrics=["dice", "hd95"], num_processes=1, progress=False, gallery=2, n_bootstrap=20)
    return out, result


# --- which cases, which slice, which plane --------------------------------------------------------

def test_worst_cases_follow_the_metric_direction_leave_nan_out_and_break_ties_by_case():
    per_case = pd.DataFrame({
        "method": "M", "region": "r", "case": ["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"],
        "metric": ["dice"] * 5 + ["hd95"] * 5,
        "value": [50.0, np.nan, 20.0, 50.0, 10.0, 1.0, 9.0, np.nan, 9.0, 3.0],
        "g": ["x", "x", "x", "x", "y"] * 2})
    assert list(worst_cases(per_case, "dice", "M", "r", None, "all", 3)["case"]) == ["e", "c", "a"]
    assert list(worst_cases(per_case, "dice", "M", "r", "g", "x", 2)["case"]) == ["c", "a"]  # a before d (tie)
    assert list(worst_cases(per_case, "hd95", "M", "r", None, "all", 2)["case"]) == ["b", "d"]  # higher is worse


def test_the_plane_cuts_across_the_thick_axis_or_the_one_voxel_axis():
    assert plane_axis((40, 256, 256), (3.0, 0.8, 0.8)) == 0
    assert plane_axis((256, 256, 40), (0.8, 0.8, 3.0)) == 2
    assert plane_axis((256, 40, 256), (0.8, 3.0, 0.8)) == 1
    assert plane_axis((64, 64, 64), (1.0, 1.0, 1.1)) == 0  # near-isotropic: axial (axis 0)
    assert plane_axis((64, 1, 64), (0.5, 5.0, 0.5)) == 1  # a one-voxel axis wins over spacing
    assert plane_axis((1, 64, 64), (0.5, 1.0, 1.0)) == 0


def test_the_slice_of_largest_disagreement_then_of_largest_reference():
    reference = np.zeros((5, 4, 4), bool)
    reference[1:4, 1:3, 1:3] = True
    prediction = reference.copy()
    prediction[3, 1:3, 1:3] = False  # 4 voxels missed on slice 3
    prediction[0, 0, 0] = True  # 1 voxel too many on slice 0
    assert worst_slice(reference, prediction, 0) == 3
    assert worst_slice(reference, reference.copy(), 0) == 1  # no disagreement: most reference (first of ties)
    empty = np.zeros_like(reference)
    assert worst_slice(empty, empty, 0) == 2  # both empty: the middle


@pytest.mark.parametrize("spacing, axis", [((0.8, 0.8, 3.0), 0), ((3.0, 0.8, 0.8), 2)])
def test_a_panel_is_the_planted_slice_with_its_image_aligned(tmp_path, spacing, axis):
    labels, pred = make_dataset(tmp_path, n_cases=4, spacing=spacing)
    source = GallerySource(k=1, images=list_images(str(tmp_path / "imagesTs"), ["c003"]),
                           references={"c003": str(labels / "c003.nii.gz")},
                           predictions={"M": {"c003": str(pred / "c003.nii.gz")}}, regions={"one": (1,)})
    panel = _case_panels(source, "M", "c003")["one"]
    # spacing is SimpleITK's x, y, z: (3.0, 0.8, 0.8) makes numpy's axis 2 (x) the thick one
    assert panel.where.endswith(f"across axis {axis}")
    assert panel.image.ndim == panel.reference.ndim == 2  # only the slice is kept
    assert panel.aspect == pytest.approx(1.0)  # the two fine axes are shown
    if axis == 0:
        assert panel.where.startswith("slice 3/6")  # the planted miss (index 2)
    foreground = panel.image > 50
    assert foreground.any()
    # the bright image voxels are the reference foreground of the same slice (label 2 lies inside label 1)
    assert not (panel.reference & ~foreground).any()


def test_list_images_names_the_folder_and_the_case_without_image(tmp_path):
    (tmp_path / "img").mkdir()
    write_label_map(tmp_path / "img" / "a_0000.nii.gz", np.zeros((2, 2, 2), np.float32))
    write_label_map(tmp_path / "img" / "b.nii.gz", np.zeros((2, 2, 2), np.float32))  # single-channel naming
    assert sorted(list_images(str(tmp_path / "img"), ["a", "b"])) == ["a", "b"]
    with pytest.raises(UserError, match=r"-i .*img: no image for case 'c' \(expected c_0000"):
        list_images(str(tmp_path / "img"), ["a", "c"])


# --- the report folder ----------------------------------------------------------------------------

def _colour_pixels(png: Path, colour: str) -> int:
    rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    pixels = matplotlib.image.imread(str(png))[..., :3]
    return int((np.abs(pixels - rgb).max(axis=-1) < 0.08).sum())


def test_evaluate_writes_a_gallery_per_metric_with_both_contours(report):
    out, result = report
    for metric in ("dice", "hd95"):
        png = out / f"worst_{metric}.png"
        assert png.is_file()
        assert _colour_pixels(png, REFERENCE_COLOUR) > 50
        assert _colour_pixels(png, PREDICTION_COLOUR) > 50
    height, width = matplotlib.image.imread(str(out / "worst_dice.png")).shape[:2]
    # rows: 2 groups x 2 regions (labels 1 and 2), columns: k = 2 cases of the one method
    assert height > 1.5 * width
    assert result.gallery.k == 2 and result.gallery.images_folder.endswith("imagesTs")


def test_the_planted_case_is_the_first_of_its_group(report):
    out, result = report
    worst = worst_cases(result.per_case, "dice", "M", "1", "age", "young", 2)
    assert worst["case"].iloc[0] == "c003"


def test_cli_gallery_0_and_missing_images(dataset, tmp_path):
    root, labels, pred = dataset
    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "off", "--gallery", "0", "-np", "1")
    assert done.returncode == 0, done.stderr
    assert not list((tmp_path / "off").glob("worst_*.png"))
    assert "Gallery</dt><dd>none" in (tmp_path / "off" / "report.html").read_text()

    empty = tmp_path / "no_images"
    empty.mkdir()
    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "bad", "-i", empty, "-np", "1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"nnunet_dro evaluate: error: -i {empty}: no image for case 'c000' (expected c000_0000 with one of "
        ".nii.gz, .nii, .nrrd, .mha, .gipl, .png, .bmp, .tif, .tiff); give the images folder of these cases, "
        "or --gallery 0 for no gallery"]
    assert not (tmp_path / "bad").exists()

    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "neg", "--gallery", "-1")
    assert done.returncode == 2 and "argument --gallery: -1 is not an integer >= 0" in done.stderr


def test_images_beside_the_labels_missing_a_case_warn_and_draw_no_gallery(tmp_path):
    labels, pred = make_dataset(tmp_path, n_cases=3)
    (tmp_path / "imagesTs" / "c001_0000.nii.gz").unlink()
    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "out", "-np", "1")
    assert done.returncode == 0, done.stderr
    assert "warning: no gallery of worst cases" in done.stderr and "'c001'" in done.stderr
    assert not list((tmp_path / "out").glob("worst_*.png"))
    # -i names another folder: the gallery comes back, and a later run without images removes it
    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "out", "-np", "1", "-i", tmp_path / "img2",
                   "--gallery", "1")
    assert done.returncode == 2  # no such folder
    (tmp_path / "imagesTs" / "c001_0000.nii.gz").symlink_to(tmp_path / "imagesTs" / "c000_0000.nii.gz")
    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "out", "-np", "1", "--gallery", "1")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "worst_dice.png").is_file()
    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "out", "-np", "1", "--gallery", "0")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out" / "worst_dice.png").exists()  # a report file of the earlier run


def test_2d_cases_png_and_one_slice_nifti(tmp_path):
    from skimage.io import imsave

    rng = np.random.default_rng(1)
    for kind in ("png", "nifti"):
        labels, images, pred = (tmp_path / kind / name for name in ("labelsTs", "imagesTs", "pred"))
        for folder in (labels, images, pred):
            folder.mkdir(parents=True)
        for i in range(3):
            truth = np.zeros((24, 24), np.uint8)
            truth[4 + i:14 + i, 5:17] = 1
            prediction = np.roll(truth, i, axis=1)
            image = (120 * truth + rng.integers(0, 20, truth.shape)).astype(np.uint8)
            if kind == "png":
                imsave(labels / f"c{i}.png", truth, check_contrast=False)
                imsave(pred / f"c{i}.png", prediction, check_contrast=False)
                imsave(images / f"c{i}_0000.png", image, check_contrast=False)
            else:
                write_label_map(labels / f"c{i}.nii.gz", truth[np.newaxis])
                write_label_map(pred / f"c{i}.nii.gz", prediction[np.newaxis])
                write_label_map(images / f"c{i}_0000.nii.gz", image[np.newaxis].astype(np.float32))
        out = tmp_path / kind / "out"
        result = evaluate(str(labels), {"M": str(pred)}, str(out), num_processes=1, progress=False, gallery=3)
        assert result.gallery is not None
        png = out / "worst_dice.png"
        assert _colour_pixels(png, REFERENCE_COLOUR) > 20 and _colour_pixels(png, PREDICTION_COLOUR) > 20


# --- report.html ----------------------------------------------------------------------------------

class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_report_html_is_self_contained_with_every_figure_and_the_settings(report):
    out, result = report
    text = (out / "report.html").read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    figures = sorted(p.name for p in out.glob("*.png"))
    assert figures == ["boxplots_dice.png", "boxplots_hd95.png", "disparity_dice.png", "disparity_hd95.png",
                       "worst_dice.png", "worst_hd95.png"]
    assert len(images) == len(figures)
    embedded = {base64.b64decode(src.split(",", 1)[1]) for src in images}
    assert embedded == {(out / name).read_bytes() for name in figures}  # each figure, byte for byte
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert not [t for t, _ in page.tags if t in ("script", "link", "iframe", "object")]
    assert not re.search(r"(src|href)\s*=\s*\"(https?:|//)", text)
    assert sum(t == "table" for t, _ in page.tags) == (out / "table.md").read_text().count("\n|---")
    assert "case-resampling bootstrap: 95 % percentile intervals, 20 resamples" in text
    assert "--empty one" in text and "0.001 mm (spacing, origin)" in text
    assert "reference: green, solid; prediction: red, dashed" in text
    summary = text.split('<section id="summary">')[1].split("</section>")[0]
    assert "Dice (%), by age" in summary and "<pre>" in summary  # the terminal's summary


def test_report_html_names_intervals_over_runs(dataset, tmp_path):
    import shutil

    from nnunet_dro.evaluation.multirun import evaluate_runs

    root, labels, pred = dataset
    shutil.copytree(pred, tmp_path / "pred2")
    evaluate_runs(str(labels), {"M": [str(pred), str(tmp_path / "pred2")]}, str(tmp_path / "runs"), num_processes=1,
                  progress=False, n_bootstrap=20, paired=False)
    text = (tmp_path / "runs" / "report.html").read_text(encoding="utf-8")
    assert "intervals over runs (runs and test cases resampled)" in text
    assert "case-resampling bootstrap" not in text
    assert "none: several runs per method have no gallery" in text


def test_an_image_of_another_shape_stops_the_run_and_writes_nothing(tmp_path):
    labels, pred = make_dataset(tmp_path, n_cases=3)
    for case in ("c000", "c001", "c002"):  # every image one slice short: whichever case the gallery shows first
        write_label_map(tmp_path / "imagesTs" / f"{case}_0000.nii.gz", np.zeros((5, 20, 20), np.float32),
                        spacing=(0.8, 0.8, 3.0))
    done = run_cli("-ref", labels, "-pred", f"M={pred}", "-o", tmp_path / "out", "-np", "1")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"nnunet_dro evaluate: error: image .*imagesTs/c00\d_0000\.nii\.gz: shape \(5, 20, 20\) does "
                        r"not match its reference .*labelsTs/c00\d\.nii\.gz \(6, 20, 20\) \(numpy order\)", line), line
    assert not (tmp_path / "out").exists()


def test_cross_validation_finds_the_trainer_folders_raw_images(tmp_path, monkeypatch):
    from test_eval_crossval import CASES, TRAINER, _truth, make_world

    raw, folders = make_world(tmp_path)
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    for i, case in enumerate(CASES[:3]):  # fold 0's cases only
        write_label_map(raw / "imagesTr" / f"{case}_0000.nii.gz", (50.0 * _truth(i)).astype(np.float32))
    folds = evaluate(None, {"CV": str(folders[TRAINER])}, str(tmp_path / "fold0"), folds=[0], num_processes=1,
                     progress=False, gallery=1)
    assert folds.gallery.images_folder == str(raw / "imagesTr")
    assert (tmp_path / "fold0" / "worst_dice.png").is_file()
    notes = []
    every = evaluate(None, {"CV": str(folders[TRAINER])}, str(tmp_path / "all"), num_processes=1, progress=False,
                     echo=notes.append)  # fold 1's cases have no image: a warning, no gallery
    assert every.gallery is None and not (tmp_path / "all" / "worst_dice.png").exists()
    assert any("no gallery of worst cases" in note and "'case_003'" in note for note in notes)
