"""Converters fail before work: ``nnUNet_raw`` unset, not writable, or the dataset folder already
there is an error before any case is read (a damaged case would otherwise be found first, after
minutes of reading a real release). Through the real CLI."""
from __future__ import annotations

import subprocess

import pytest
from test_data_brats import make_brats_tree
from test_data_feta import make_feta_tree

from converter_cli import PYTHON, listing, raw_with_other_dataset, run_converter, truncate


def _damaged_input(command: str, root):
    """An input tree whose first case is truncated: reading it would be an error of its own."""
    if command == "convert-feta":
        tree = make_feta_tree(root / "feta")
        truncate(next((tree / "sub-001" / "anat").glob("*_T2w.nii.gz")))
    else:
        tree = make_brats_tree(root / "brats")
        truncate(next(tree.rglob("*_flair.nii.gz")))
    return tree


@pytest.mark.parametrize("command", ["convert-feta", "convert-brats19"])
def test_unset_nnunet_raw_is_found_before_any_case_is_read(tmp_path, command):
    tree = _damaged_input(command, tmp_path)
    done = subprocess.run([str(PYTHON), "-m", "nnunet_dro", command, str(tree), "--id", "210"], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"nnunet_dro {command}: error: environment variable nnUNet_raw is not set; export "
        f"nnUNet_raw=/path/to/nnUNet_raw (nnU-Net's raw data folder) and run again"]


@pytest.mark.parametrize("command", ["convert-feta", "convert-brats19"])
def test_unwritable_nnunet_raw_is_found_before_any_case_is_read(tmp_path, command):
    tree = _damaged_input(command, tmp_path)
    done = run_converter(command, tree, "--id", "210", raw="/sys/nnunet_dro_raw")  # even root cannot write there
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"nnunet_dro {command}: error: nnUNet_raw /sys/nnunet_dro_raw: cannot write in /sys (Operation not "
        f"permitted)"]


@pytest.mark.parametrize("command", ["convert-feta", "convert-brats19"])
def test_existing_dataset_folder_is_found_before_any_case_is_read(tmp_path, command):
    tree = _damaged_input(command, tmp_path)
    raw, _ = raw_with_other_dataset(tmp_path)
    name = "FeTA" if command == "convert-feta" else "BraTS2019"
    (raw / f"Dataset210_{name}").mkdir()
    before = listing(raw)
    done = run_converter(command, tree, "--id", "210", raw=raw)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"nnunet_dro {command}: error: {raw / f'Dataset210_{name}'} already exists; pass --overwrite to replace it"]
    assert listing(raw) == before
