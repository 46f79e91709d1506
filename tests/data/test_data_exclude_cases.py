"""``nnunet_dro exclude-cases``: a raw dataset without some training cases. What is left out and what
is kept (a table of edge cases), what is linked and what copied, the subgroup table byte for byte,
and the CLI as a subprocess after a real audit, with nnU-Net's own integrity check on the result."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from converter_cli import listing, run_converter
from nnunet_dro.data.exclude_cases import EXCLUDED_FILENAME, training_cases, write_dataset_without
from nnunet_dro.errors import UserError


def _toy(root: Path, cases=("a", "b", "c"), channels=2, extra_meta=None) -> Path:
    """A raw dataset of byte files (names are what matters here): two channels, a test case, a subgroup table."""
    for case in cases:
        for channel in range(channels):
            (root / "imagesTr").mkdir(parents=True, exist_ok=True)
            (root / "imagesTr" / f"{case}_{channel:04d}.nii.gz").write_bytes(f"img {case} {channel}".encode())
        (root / "labelsTr").mkdir(exist_ok=True)
        (root / "labelsTr" / f"{case}.nii.gz").write_bytes(f"seg {case}".encode())
    (root / "imagesTs").mkdir()
    (root / "imagesTs" / "t_0000.nii.gz").write_bytes(b"test")
    (root / "dataset.json").write_text(json.dumps({"numTraining": len(cases), "file_ending": ".nii.gz",
                                                   **(extra_meta or {})}))
    (root / "subgroups.tsv").write_text("case\tcondition\tga\n" + "".join(f"{c}\tcontrol\t22.50\n" for c in cases)
                                        + "t\tother\t30\n")
    return root


# name -> (cases left out, training cases expected to remain)
KEPT = {
    "one case of three": (["b"], ["a", "c"]),
    "two cases": (["a", "c"], ["b"]),
    "a case whose name is another's prefix": (["a"], ["a1", "b"]),
}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_left_out_cases_go_with_every_channel_and_the_rest_stays(tmp_path, name):
    left_out, kept = KEPT[name]
    source = _toy(tmp_path / "src", cases=sorted({*left_out, *kept}))
    target = tmp_path / "out"
    target.mkdir()
    assert write_dataset_without(source, target, {case: "why" for case in left_out}) == sorted(left_out)
    assert training_cases(target) == kept
    assert sorted(p.name for p in (target / "imagesTr").iterdir()) == [f"{c}_{ch:04d}.nii.gz" for c in kept for ch in (0, 1)]
    assert json.loads((target / "dataset.json").read_text())["numTraining"] == len(kept)
    assert (target / "imagesTs" / "t_0000.nii.gz").read_bytes() == b"test"  # test cases never touched
    subgroups = (target / "subgroups.tsv").read_text().splitlines()
    assert subgroups == ["case\tcondition\tga", *[f"{c}\tcontrol\t22.50" for c in kept], "t\tother\t30"]
    assert pd.read_csv(target / EXCLUDED_FILENAME, sep="\t")["case"].tolist() == sorted(left_out)
    assert training_cases(source) == sorted({*left_out, *kept})  # the source is unchanged


def test_images_are_linked_and_labels_copied(tmp_path):
    source = _toy(tmp_path / "src")
    target = tmp_path / "out"
    target.mkdir()
    write_dataset_without(source, target, {"b": "why"})
    image = "imagesTr/a_0000.nii.gz"
    assert os.stat(source / image).st_ino == os.stat(target / image).st_ino  # no second copy of an image
    assert os.stat(source / "labelsTr/a.nii.gz").st_ino != os.stat(target / "labelsTr/a.nii.gz").st_ino
    (target / "labelsTr/a.nii.gz").write_bytes(b"mended")  # in place, as SimpleITK's WriteImage does
    assert (source / "labelsTr/a.nii.gz").read_bytes() == b"seg a"


def test_dataset_list_of_dataset_json_follows(tmp_path):
    files = {c: {"images": [f"imagesTr/{c}_0000.nii.gz"], "label": f"labelsTr/{c}.nii.gz"} for c in "abc"}
    source = _toy(tmp_path / "src", extra_meta={"dataset": files})
    target = tmp_path / "out"
    target.mkdir()
    write_dataset_without(source, target, {"c": "why"})
    assert sorted(json.loads((target / "dataset.json").read_text())["dataset"]) == ["a", "b"]


@pytest.mark.parametrize("left_out, message", [
    (["z"], "no training case 'z'"),
    (["t"], "no training case 't'"),  # a test case is not a training case
    (["a", "b", "c"], "leaves nothing to train on"),
])
def test_refused(tmp_path, left_out, message):
    source = _toy(tmp_path / "src")
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(UserError, match=message):
        write_dataset_without(source, target, {case: "why" for case in left_out})


def _erase_label(path: Path, label: int) -> None:
    image = nib.load(str(path))
    seg = np.asarray(image.dataobj).copy()
    assert (seg == label).any(), f"{path} has no label {label} to erase"
    seg[seg == label] = 0
    nib.save(nib.Nifti1Image(seg, image.affine, image.header), str(path))


def _fetal(raw: Path, n_train=12) -> Path:
    result = run_converter("make-synthetic", "--kind", "fetal", "--id", "201", "-n", "Fetal", "--n-train", n_train,
                           "--n-test", 3, "--size", 16, "--seed", 3, raw=raw)
    assert result.returncode == 0, result.stderr
    return raw / "Dataset201_Fetal"


@pytest.mark.slow
def test_cli_after_an_audit_and_nnunets_integrity_check_accepts_the_result(tmp_path):
    raw = tmp_path / "nnUNet_raw"
    source = _fetal(raw)
    groups = dict(pd.read_csv(source / "subgroups.tsv", sep="\t", dtype=str).query("split == 'train'")
                  [["case", "condition"]].values)
    erased = sorted(groups)[0]
    _erase_label(source / "labelsTr" / f"{erased}.nii.gz", 1)  # a partial annotation the audit flags missing
    audit = tmp_path / "audit.tsv"
    result = run_converter("audit-labels", "-i", source, "-o", audit, raw=raw)
    assert result.returncode == 0, result.stderr
    assert erased in set(pd.read_csv(audit, sep="\t").query("flag == 'missing'")["case"])
    before = listing(source)
    result = run_converter("exclude-cases", "-i", source, "-table", audit, "--flags", "missing", "--id", "202",
                           "-n", "FetalAudited", raw=raw)
    assert result.returncode == 0, result.stderr
    target = raw / "Dataset202_FetalAudited"
    assert erased in result.stdout and str(target) in result.stdout
    assert listing(source) == before
    excluded = pd.read_csv(target / EXCLUDED_FILENAME, sep="\t")
    assert excluded["case"].tolist() == [erased] and "missing" in excluded["reason"][0]
    assert erased not in training_cases(target) and len(training_cases(target)) == 11
    env = {**os.environ, "nnUNet_raw": str(raw), "nnUNet_preprocessed": str(tmp_path / "pre"),
           "nnUNet_results": str(tmp_path / "res"), "nnUNet_def_n_proc": "1"}
    bin_dir = Path(sys.executable).parent
    check = subprocess.run([str(bin_dir / "nnUNetv2_extract_fingerprint"), "-d", "202", "-np", "1",
                            "--verify_dataset_integrity"], capture_output=True, text=True, env=env, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    fingerprint = json.loads((tmp_path / "pre" / "Dataset202_FetalAudited" / "dataset_fingerprint.json").read_text())
    assert len(fingerprint["spacings"]) == 11


@pytest.fixture(scope="module")
def small_raw(tmp_path_factory) -> Path:
    """One synthetic raw dataset (6 training cases) and an audit table, shared read-only by the
    bad-input cases (each asserts that nothing is written)."""
    raw = tmp_path_factory.mktemp("bad_input") / "nnUNet_raw"
    _fetal(raw, n_train=6)
    (raw.parent / "audit.tsv").write_text("case\tlabel\tflag\nfetal_000\tcerebellum\tmissing\n")
    return raw


@pytest.mark.parametrize("args, message", [
    (["--cases", "nope", "--id", "202"], "no training case 'nope'"),
    (["--cases", "fetal_000", "--flags", "missing", "--id", "202"], "--flags selects rows of -table"),
    (["-table", "{tmp}/missing.tsv", "--id", "202"], "missing.tsv"),
    (["-table", "{tmp}/audit.tsv", "--flags", "large", "--id", "202"], "none in"),
    (["--cases", "fetal_000", "--id", "201", "-n", "Fetal"], "already exists"),
    (["--cases", "fetal_000", "--id", "201", "-n", "Fetal", "--overwrite"], "the input dataset itself"),
])
def test_cli_bad_input_is_a_one_line_error_and_writes_nothing(small_raw, args, message):
    raw = small_raw
    before = listing(raw)
    result = run_converter("exclude-cases", "-i", raw / "Dataset201_Fetal", *[a.format(tmp=raw.parent) for a in args],
                           raw=raw)
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert listing(raw) == before


@pytest.mark.parametrize("args, message", [
    (["-d", "209", "--cases", "fetal_000", "--id", "203"], "-d 209: no dataset of that ID or name in nnUNet_raw="),
    (["-d", "201", "--cases", "fetal_000"], "give the ID of the dataset to write: --id ID"),
    (["--cases", "fetal_000", "--id", "203"], "give the input dataset: -d ID_OR_NAME"),
    (["-i", "{raw}/Dataset201_Fetal", "-d", "202", "--cases", "fetal_000"],  # -d is never the dataset written
     "both name the input dataset; give one of them (the dataset written is --id)"),
])
def test_cli_input_dataset_by_id_or_name(small_raw, args, message):
    """-d is the input dataset (ID or name) as in nnU-Net; --id the dataset written."""
    raw = small_raw
    before = listing(raw)
    result = run_converter("exclude-cases", *[a.format(raw=raw) for a in args], raw=raw)
    assert result.returncode == 2 and message in result.stderr and result.stderr.strip().count("\n") == 0
    assert listing(raw) == before
    for dataset, target in (("201", 203), ("Dataset201_Fetal", 204)):
        done = run_converter("exclude-cases", "-d", dataset, "--cases", "fetal_000", "--id", str(target), "-n", "X",
                             raw=raw)
        assert done.returncode == 0 and (raw / f"Dataset{target}_X").is_dir(), done.stderr
        shutil.rmtree(raw / f"Dataset{target}_X")
