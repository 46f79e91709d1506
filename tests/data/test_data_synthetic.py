"""Synthetic cohorts: reproducibility, hidden stratification, anatomy facts, the CLI."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from data_raw_checks import assert_valid_raw_dataset
from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.synthetic_brats import generate_brats_cohort, make_brats_dataset
from nnunet_dro.data.synthetic_common import CohortSpec, group_counts, parse_fractions
from nnunet_dro.data.synthetic_fetal import CEREBELLUM, VENTRICLES, generate_fetal_cohort, make_fetal_dataset
from nnunet_dro.errors import UserError


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("make, name", [(make_fetal_dataset, "SyntheticFetal"), (make_brats_dataset, "SyntheticBraTS")])
def test_synthetic_same_seed_same_files_other_seed_other_data(tmp_path, monkeypatch, make, name):
    digests = []
    for run, seed in enumerate((5, 5, 6)):
        monkeypatch.setenv("nnUNet_raw", str(tmp_path / f"raw{run}"))
        digests.append(_digest(make(DatasetTarget(900, name), CohortSpec(n_train=4, n_test=3, size=20, seed=seed))))
    assert digests[0] == digests[1]
    images = [k for k in digests[0] if k.startswith("imagesTr")]
    assert all(digests[0][k] != digests[2][k] for k in images)


@pytest.mark.parametrize("generate", [generate_fetal_cohort, generate_brats_cohort])
def test_synthetic_arrays_are_reproducible_and_finite(generate):
    first, second = generate(3, 2, 20, 11), generate(3, 2, 20, 11)
    for a, b in zip(first, second):
        assert a.case == b.case and a.groups == b.groups
        np.testing.assert_array_equal(a.label, b.label)
        for x, y in zip(a.channels, b.channels):
            np.testing.assert_array_equal(x, y)
            assert x.dtype == np.float32 and np.isfinite(x).all()


def test_fetal_dataset_layout_labels_and_hidden_stratification(raw):
    target = make_fetal_dataset(DatasetTarget(910, "SyntheticFetal"), CohortSpec(n_train=20, n_test=9, size=24, seed=0))
    assert target == raw / "Dataset910_SyntheticFetal"
    table = assert_valid_raw_dataset(target)
    assert list(table.columns) == ["case", "condition", "gestational_age", "centre", "split"]
    dataset = json.loads((target / "dataset.json").read_text())
    # FeTA numbering, so `nnunet_dro evaluate -regions feta` finds WM 3, ventricles 4, cerebellum 5.
    assert (dataset["labels"]["white_matter"], dataset["labels"]["ventricles"],
            dataset["labels"]["cerebellum"]) == (3, 4, 5)
    counts = table.groupby(["split", "condition"]).size().to_dict()
    assert counts == {("train", "control"): 16, ("train", "spina_bifida"): 2,
                      ("train", "other"): 2, ("test", "control"): 3,
                      ("test", "spina_bifida"): 3, ("test", "other"): 3}
    assert table["gestational_age"].between(20, 35).all()
    # Case IDs reveal nothing: conditions are shuffled over the numbering.
    train = table[table.split == "train"].sort_values("case")
    assert train["condition"].tolist() != sorted(train["condition"].tolist(),
                                                 key=["control", "spina_bifida", "other"].index)


def test_fetal_anatomy_differs_by_condition_and_age():
    cases = generate_fetal_cohort(n_train=24, n_test=24, size=32, seed=3)

    def mean_volume(condition: str, label: int) -> float:
        return float(np.mean([(c.label == label).sum() for c in cases
                              if c.groups["condition"] == condition]))

    for label in range(1, 8):  # every FeTA label drawn in every control
        assert all((c.label == label).any() for c in cases if c.groups["condition"] == "control")
    assert mean_volume("spina_bifida", CEREBELLUM) < 0.5 * mean_volume("control", CEREBELLUM)
    assert mean_volume("spina_bifida", VENTRICLES) > 1.5 * mean_volume("control", VENTRICLES)
    assert mean_volume("other", VENTRICLES) > 1.5 * mean_volume("control", VENTRICLES)
    controls = [c for c in cases if c.groups["condition"] == "control"]
    ages = [c.groups["gestational_age"] for c in controls]
    brain = [(c.label >= 2).sum() for c in controls]
    assert np.corrcoef(ages, brain)[0, 1] > 0.8  # gestational age scales the brain


def test_fetal_spina_bifida_cerebellum_is_faint():
    cases = generate_fetal_cohort(n_train=10, n_test=30, size=32, seed=4)

    def contrast(case) -> float:  # cerebellum vs surrounding CSF, in units of tissue intensity
        image, label = case.channels[0], case.label
        return float(image[label == 1].mean() - image[label == CEREBELLUM].mean()) / \
            float(image[label == 3].mean())

    control = np.median([contrast(c) for c in cases if c.groups["condition"] == "control"])
    spina_bifida = np.median([contrast(c) for c in cases
                              if c.groups["condition"] == "spina_bifida"])
    assert spina_bifida < control


def test_brats_dataset_regions_nesting_and_rare_site(raw):
    target = make_brats_dataset(DatasetTarget(911, "SyntheticBraTS"), CohortSpec(n_train=20, n_test=9, size=24, seed=0))
    table = assert_valid_raw_dataset(target)
    assert list(table.columns) == ["case", "centre", "grade", "split"]
    counts = table.groupby(["split", "centre"]).size().to_dict()
    assert counts[("train", "site_C")] == 1 and counts[("test", "site_C")] == 3
    dataset = json.loads((target / "dataset.json").read_text())
    assert dataset["regions_class_order"] == [1, 2, 3] and len(dataset["channel_names"]) == 4
    for case in generate_brats_cohort(20, 9, 24, 0):
        label = case.label
        assert (label > 0).any(), case.case  # every case has a tumour
        if case.groups["grade"] == "HGG":
            assert (label == 3).any(), case.case  # enhancing rim
            # nested: necrosis (2) is enclosed by enhancing tumour (3), not touching edema
            core = np.isin(label, (2, 3))
            assert core.sum() > (label == 2).sum()


@pytest.mark.parametrize("total, fractions, expected", [
    (40, {"a": 0.8, "b": 0.12, "c": 0.08}, {"a": 32, "b": 5, "c": 3}),
    (30, {"a": 1, "b": 1, "c": 1}, {"a": 10, "b": 10, "c": 10}),
    (10, {"a": 0.98, "b": 0.02}, {"a": 9, "b": 1}),
    (1, {"a": 0.5, "b": 0.5}, {"a": 1, "b": 0}),
    (0, {"a": 1.0}, {"a": 0}),
])
def test_group_counts_sum_and_keep_rare_groups(total, fractions, expected):
    assert group_counts(total, fractions) == expected


@pytest.mark.parametrize("text, message", [
    ("control=0.5,typo=0.5", "unknown group 'typo'"),
    ("control=x", "is not NAME=NUMBER"),
    ("control=-1", "must be a finite number >= 0"),
    ("control=0", "sum to zero"),
])
def test_parse_fractions_rejects(text, message):
    with pytest.raises(UserError, match=message):
        parse_fractions(text, ["control", "spina_bifida", "other"])


def test_fetal_new_centre_keeps_the_anatomy_and_changes_the_acquisition():
    """site_C renders the same seed's cases (same anatomy, labels, groups) with another acquisition:
    thick slices (neighbouring slices more alike along the first axis) and a flatter grey/white
    contrast; the cohort without it is unchanged (site C is never drawn)."""
    drawn = generate_fetal_cohort(n_train=6, n_test=6, size=24, seed=7)
    shifted = generate_fetal_cohort(n_train=6, n_test=6, size=24, seed=7, site="site_C")
    assert "site_C" not in {c.groups["centre"] for c in drawn}
    assert {c.groups["centre"] for c in shifted} == {"site_C"}
    for a, b in zip(drawn, shifted):
        assert np.array_equal(a.label, b.label) and a.split == b.split
        assert {k: v for k, v in a.groups.items() if k != "centre"} == \
            {k: v for k, v in b.groups.items() if k != "centre"}

    def grey_white(case) -> float:  # white minus grey matter, in units of the brain's mean
        image, label = case.channels[0], case.label
        return float(image[label == 3].mean() - image[label == 2].mean()) / float(image[label > 0].mean())

    def slice_step(case, axis: int) -> float:  # mean absolute change from one slice to the next
        image = case.channels[0] / case.channels[0][case.label > 0].mean()
        return float(np.abs(np.diff(image, axis=axis)).mean())

    assert np.median([grey_white(b) / grey_white(a) for a, b in zip(drawn, shifted)]) < 0.8
    assert all(slice_step(b, 0) < slice_step(b, 2) for b in shifted)
    with pytest.raises(ValueError, match="site 'site_D'"):
        generate_fetal_cohort(n_train=2, n_test=0, size=24, seed=7, site="site_D")


def _cli(args: list[str], raw: Path | None) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if raw is not None:
        env["nnUNet_raw"] = str(raw)
    return subprocess.run([sys.executable, "-m", "nnunet_dro", "make-synthetic", *args],
                          capture_output=True, text=True, env=env)


def test_make_synthetic_cli(tmp_path):
    raw = tmp_path / "raw"
    ok = _cli(["--kind", "brats", "--id", "912", "--n-train", "3", "--n-test", "2", "--size", "16",
               "--train-mix", "site_A=1,site_B=1,site_C=0", "--seed", "2"], raw)
    assert ok.returncode == 0, ok.stderr
    assert "Dataset912_SyntheticBraTS" in ok.stdout
    table = pd.read_csv(raw / "Dataset912_SyntheticBraTS" / "subgroups.tsv", sep="\t")
    assert "site_C" not in set(table[table.split == "train"].centre)
    again = _cli(["--kind", "brats", "--id", "912", "--n-train", "3", "--size", "16"], raw)
    assert again.returncode == 2
    assert again.stderr.strip().endswith("already exists; pass --overwrite to replace it")
    bad_mix = _cli(["--id", "913", "--train-mix", "controls=1"], raw)
    assert bad_mix.returncode == 2 and "unknown group 'controls'" in bad_mix.stderr
    assert len(bad_mix.stderr.strip().splitlines()) == 1
    shifted = _cli(["--id", "914", "--n-train", "2", "--n-test", "3", "--size", "16", "--site", "site_C"], raw)
    assert shifted.returncode == 0, shifted.stderr
    assert set(pd.read_csv(raw / "Dataset914_SyntheticFetal" / "subgroups.tsv", sep="\t").centre) == {"site_C"}
    brats_site = _cli(["--kind", "brats", "--id", "915", "--site", "site_C"], raw)
    assert brats_site.returncode == 2 and "--site site_C: only --kind fetal" in brats_site.stderr
    assert len(brats_site.stderr.strip().splitlines()) == 1 and not list(raw.glob("Dataset915_*"))



@pytest.mark.parametrize("n_train, n_test, size, message", [
    (0, 5, 32, "need --n-train >= 1"), (5, -1, 32, "--n-test >= 0"),
    (5, 5, 8, "--size 8 is outside 16..256"), (5, 5, 512, "--size 512 is outside")])
@pytest.mark.parametrize("generate", [generate_fetal_cohort, generate_brats_cohort])
def test_synthetic_rejects_bad_sizes(generate, n_train, n_test, size, message):
    with pytest.raises(UserError, match=message):
        generate(n_train, n_test, size, 0)
