"""Label noise for the benchmark's dirty-data condition: each kind of corruption (a table of edge
cases), the choice of cases (both groups, seeded), and the in-place rewrite of real NIfTI files."""
from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from nnunet_dro.errors import UserError
from nnunet_dro.lab.label_noise import choose_noisy_cases, corrupt, corrupt_training_labels


def _seg(labels=(1, 2, 3)):
    seg = np.zeros((16, 16, 16), np.uint8)
    for k, label in enumerate(labels):
        seg[2 + 4 * k:5 + 4 * k, 4:12, 4:12] = label
    return seg


# kind -> (labels present, check on (original, corrupted))
CASES = {
    "erase removes exactly one structure": ("erase", (1, 2, 3), lambda a, b: len(np.unique(b)) == len(np.unique(a)) - 1),
    "erase on an empty map changes nothing": ("erase", (), lambda a, b: np.array_equal(a, b)),
    "swap keeps the voxels, exchanges two labels": ("swap", (1, 2, 3),
                                                   lambda a, b: np.array_equal(a > 0, b > 0) and not np.array_equal(a, b)),
    "swap needs two labels": ("swap", (1,), lambda a, b: np.array_equal(a, b)),
    "shift moves the mask and keeps its labels": ("shift", (1, 2), lambda a, b: set(np.unique(b)) <= set(np.unique(a))
                                                   and not np.array_equal(a, b)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_corruption_kinds(name):
    kind, labels, check = CASES[name]
    seg = _seg(labels)
    noisy, what = corrupt(seg, kind, np.random.default_rng(1))
    assert noisy.shape == seg.shape and noisy.dtype == seg.dtype and check(seg, noisy), what


def test_unknown_kind_is_an_error():
    with pytest.raises(UserError, match="label noise kind 'blur'"):
        corrupt(_seg(), "blur", np.random.default_rng(0))


def test_cases_come_from_both_groups_and_are_seeded():
    groups = {f"c{i:02d}": "control" for i in range(20)} | {f"s{i}": "spina_bifida" for i in range(3)} | {"o0": "other"}
    chosen = choose_noisy_cases(groups, 4, ("spina_bifida", "other"), seed=3)
    assert chosen == choose_noisy_cases(groups, 4, ("spina_bifida", "other"), seed=3)
    assert sum(groups[c] != "control" for c in chosen) == 2 and len(set(chosen)) == 4
    # more than the minorities hold: the rest from the majority
    assert sum(groups[c] != "control" for c in choose_noisy_cases(groups, 10, ("spina_bifida", "other"), 0)) == 4
    with pytest.raises(UserError, match="--label-noise 30"):
        choose_noisy_cases(groups, 30, ("spina_bifida", "other"), 0)


def test_training_labels_rewritten_in_place_with_a_record(tmp_path):
    groups = {"a": "control", "b": "control", "c": "other", "d": "other"}
    for case in groups:
        nib.save(nib.Nifti1Image(_seg(), np.eye(4)), str(tmp_path / f"{case}.nii.gz"))
    rows = corrupt_training_labels(tmp_path, groups, 3, ("other",), seed=0, record=tmp_path / "label_noise.json")
    assert [r["kind"] for r in rows] == ["erase", "swap", "shift"]
    assert json.loads((tmp_path / "label_noise.json").read_text()) == rows
    changed = {case for case in groups
               if not np.array_equal(np.asarray(nib.load(str(tmp_path / f"{case}.nii.gz")).dataobj), _seg())}
    assert changed == {r["case"] for r in rows} and not list(tmp_path.glob("*.tmp*"))
