"""``nnunet_dro audit-labels``: the flags on a volume table (a table of edge cases), the labels read
from dataset.json, volumes in mL from real NIfTI files of different spacings, and the CLI run as a
subprocess, finding a structure erased from one label map."""
from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from converter_cli import run_converter, truncate
from nnunet_dro.data.label_audit import FLAG_COLUMNS, audit_volumes, dataset_labels, label_volumes
from nnunet_dro.errors import UserError

STEADY = [10.0, 11, 9, 10, 12, 10, 11, 9, 10, 10]


def _table(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    return pd.DataFrame({"case": [f"c{i}" for i in range(n)], **columns})


# name -> (volume table, expected flags as (case, label, flag))
CASES = {
    "a steady cohort: nothing": (_table(a=STEADY), []),
    "a structure absent from one case of ten: missing": (_table(a=STEADY[:9] + [0.0]), [("c9", "a", "missing")]),
    "absent from 2 of 10 (8 of the 9 others: below 0.9): not flagged": (_table(a=STEADY[:8] + [0.0, 0.0]), []),
    "absent from 1 of 8 (7 of 7 others have it): missing": (_table(a=STEADY[:7] + [0.0]), [("c7", "a", "missing")]),
    "absent from 1 of 3: missing": (_table(a=[10.0, 11, 0.0]), [("c2", "a", "missing")]),
    "a single case: nothing to judge against": (_table(a=[0.0]), []),
    "a volume 10 times the rest: large": (_table(a=STEADY[:9] + [100.0]), [("c9", "a", "large")]),
    "a volume a tenth of the rest: small": (_table(a=STEADY[:9] + [1.0]), [("c9", "a", "small")]),
    "1.3 times the upper quartile stays inside the far-out fence": (_table(a=STEADY[:9] + [14.0]), []),
    "a spread near 0 still needs a factor 1.5 beyond the quartiles": (_table(a=[10.0] * 9 + [14.0]), []),
    "equal volumes (no spread): nothing": (_table(a=[0.064] * 10), []),
    "fewer than 8 cases with the structure: no volume fence": (_table(a=[10.0, 11, 9, 10, 100.0]), []),
    "a structure nobody has: nothing": (_table(a=[0.0] * 10), []),
    "two labels, flags sorted by case": (_table(a=STEADY[:9] + [0.0], b=[100.0] + STEADY[1:]),
                                         [("c0", "b", "large"), ("c9", "a", "missing")]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flags(name):
    volumes, expected = CASES[name]
    flags = audit_volumes(volumes)
    assert list(flags.columns) == FLAG_COLUMNS
    assert [tuple(row) for row in flags[["case", "label", "flag"]].values] == expected


def test_presence_and_fence_are_the_users_to_set():
    volumes = _table(a=STEADY[:7] + [0.0, 0.0, 30.0])
    assert [tuple(r) for r in audit_volumes(volumes)[["case", "label", "flag"]].values] == [("c9", "a", "large")]
    flags = audit_volumes(volumes, presence=0.75, fence=10.0)  # 7 of the 9 others have it
    assert [tuple(r) for r in flags[["case", "label", "flag"]].values] == [("c7", "a", "missing"), ("c8", "a", "missing")]
    for presence, fence in ((1.5, 3.0), (0.9, 0.0)):
        with pytest.raises(UserError):
            audit_volumes(volumes, presence=presence, fence=fence)


@pytest.mark.parametrize("labels, expected", [
    ({"background": 0, "wm": 1, "csf": 2}, {"wm": [1], "csf": [2]}),
    ({"background": 0, "whole tumor": [1, 2, 3], "enhancing": [3], "ignore": 4},
     {"whole tumor": [1, 2, 3], "enhancing": [3]}),
])
def test_dataset_labels(tmp_path, labels, expected):
    (tmp_path / "dataset.json").write_text(json.dumps({"labels": labels}))
    assert dataset_labels(tmp_path / "dataset.json") == expected


@pytest.mark.parametrize("text", ['{"labels": {"background": 0}}', '{"labels": {"a": "one"}}', "{", "{}"])
def test_dataset_labels_rejects(tmp_path, text):
    (tmp_path / "dataset.json").write_text(text)
    with pytest.raises(UserError, match="dataset.json"):
        dataset_labels(tmp_path / "dataset.json")


def _dataset(root, n=10, spacing=(1.0, 1.0, 1.0)):
    """An nnU-Net raw dataset of ``n`` label maps: label 1 a 4x4x4 block, label 2 a 2x4x4 block."""
    labels = root / "labelsTr"
    labels.mkdir(parents=True)
    (root / "dataset.json").write_text(json.dumps({"labels": {"background": 0, "wm": 1, "csf": 2},
                                                   "file_ending": ".nii.gz", "numTraining": n}))
    for i in range(n):
        seg = np.zeros((12, 12, 12), np.uint8)
        seg[2:6, 2:6, 2:6] = 1
        seg[7:9, 2:6, 2:6] = 2
        nib.save(nib.Nifti1Image(seg, np.diag([*spacing, 1.0])), str(labels / f"case_{i:03d}.nii.gz"))
    return root


def test_volumes_are_in_millilitres_whatever_the_spacing(tmp_path):
    coarse = _dataset(tmp_path / "coarse", n=2, spacing=(2.0, 2.0, 2.0))
    volumes = label_volumes(coarse / "labelsTr", {"wm": [1], "csf": [2], "both": [1, 2]}, num_processes=2)
    assert volumes["case"].tolist() == ["case_000", "case_001"]
    assert volumes["wm"].tolist() == pytest.approx([64 * 8 / 1000] * 2)
    assert volumes["both"].tolist() == pytest.approx([96 * 8 / 1000] * 2)


def test_cli_finds_an_erased_structure_and_writes_the_table(tmp_path):
    dataset = _dataset(tmp_path / "Dataset001_Toy")
    _erase(dataset, "case_004", 2)  # a partial annotation: csf left out
    out = tmp_path / "audit.tsv"
    result = run_converter("audit-labels", "-i", dataset, "-o", out, "-np", "2", raw=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "case_004\tcsf\tmissing" in result.stdout
    assert "1 of 10 cases flagged" in result.stdout
    table = pd.read_csv(out, sep="\t")
    assert table[["case", "label", "flag"]].values.tolist() == [["case_004", "csf", "missing"]]


def test_cli_without_dataset_json_is_a_one_line_error(tmp_path):
    result = run_converter("audit-labels", "-i", tmp_path, raw=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "dataset.json" in result.stderr


def test_cli_names_a_broken_label_file(tmp_path):
    dataset = _dataset(tmp_path / "Dataset001_Toy")
    truncate(dataset / "labelsTr" / "case_004.nii.gz")
    result = run_converter("audit-labels", "-i", dataset, "-np", "2", raw=tmp_path)
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().count("\n") == 0 and "case_004.nii.gz" in result.stderr


def test_within_groups_a_groups_anatomy_is_not_flagged():
    ventricles = [5.0, 5.4, 4.8, 5.1, 5.3, 4.9, 5.2, 5.0, 4.7, 5.5] * 3 + [20.0, 22, 18, 21, 25, 19, 23, 20.5]
    volumes = _table(ventricles=ventricles)
    assert set(audit_volumes(volumes)["case"]) == {f"c{i}" for i in range(30, 38)}
    groups = pd.Series(["control"] * 30 + ["other"] * 8, index=volumes["case"])
    assert audit_volumes(volumes, groups=groups).empty
    with pytest.raises(UserError, match="no group for 1 case"):
        audit_volumes(volumes, groups=groups.drop("c37"))


def test_cli_audits_within_the_groups_of_a_subgroup_table(tmp_path):
    dataset = _dataset(tmp_path / "Dataset001_Toy")
    table = tmp_path / "subgroups.tsv"
    table.write_text("case\tcondition\n" + "".join(f"case_{i:03d}\t{'a' if i < 5 else 'b'}\n" for i in range(10)))
    result = run_converter("audit-labels", "-i", dataset, "-groups", table, "--group-by", "condition", raw=tmp_path)
    assert result.returncode == 0 and "0 of 10 cases flagged" in result.stdout, result.stderr
    for extra, message in ((["-groups", table], "go together"), (["-groups", table, "--group-by", "centre"], "centre")):
        result = run_converter("audit-labels", "-i", dataset, *extra, raw=tmp_path)
        assert result.returncode == 2 and message in result.stderr and result.stderr.strip().count("\n") == 0


@pytest.mark.lab  # a benchmark script's run (make test-lab)
def test_benchmark_script_finds_every_erased_structure_of_a_noisy_benchmark_cohort():
    """scripts/benchmark_label_audit.py on one seed: the benchmark's cohort, its label noise, the audit."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_label_audit.py"
    result = subprocess.run([sys.executable, str(script), "--seeds", "16", "--label-noise", "8"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.split()}
    assert rows["erase"] == ["3", "3", "3", "3", "3"]  # 3 erased; each flagged missing, both ways
    assert rows["control"][1:] == ["0", "0", "0", "0"]  # no clean control flagged, either way


def _erase(dataset, case: str, label: int) -> None:
    path = dataset / "labelsTr" / f"{case}.nii.gz"
    image = nib.load(str(path))
    seg = np.asarray(image.dataobj).copy()
    seg[seg == label] = 0
    nib.save(nib.Nifti1Image(seg, image.affine), str(path))


def test_cli_with_groups_flags_a_structure_missing_in_a_small_group_and_says_what_each_group_can_show(tmp_path):
    """The trap of issue 65: 40 cases, wm erased in 5 (one in a group of 5, one in a group of 3);
    within-group presence alone (4/5, 2/3 under 0.9) missed both minority cases, exit 0, no warning."""
    dataset = _dataset(tmp_path / "Dataset001_Toy", n=40)
    conditions = ["control"] * 32 + ["spina_bifida"] * 5 + ["other"] * 3
    table = tmp_path / "subgroups.tsv"
    table.write_text("case\tcondition\n" + "".join(f"case_{i:03d}\t{c}\n" for i, c in enumerate(conditions)))
    erased = ["case_000", "case_001", "case_002", "case_032", "case_037"]  # 3 control, 1 spina bifida, 1 other
    for case in erased:
        _erase(dataset, case, 1)
    out = tmp_path / "audit.csv"
    result = run_converter("audit-labels", "-i", dataset, "-groups", table, "--group-by", "condition", "-o", out,
                           raw=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "5 of 40 cases flagged" in result.stdout
    assert ("group other (3 cases): missing: up to 1 of its 3 cases within the group, more only against the cohort; "
            "volumes: no fences (fewer than 8 cases), not judged") in result.stderr
    assert "group control (32 cases): missing: up to 4 of its 32 cases within the group" in result.stderr
    flags = pd.read_csv(out)  # .csv: comma-separated, as its name says
    assert flags["case"].tolist() == erased and set(flags["flag"]) == {"missing"}
    assert list(flags.columns) == FLAG_COLUMNS
    # what audit-labels writes, exclude-cases reads (one table reader: nnunet_dro/tables.py)
    excluded = run_converter("exclude-cases", "-i", dataset, "-table", out, "--id", "2", "-n", "Audited", raw=tmp_path)
    assert excluded.returncode == 0, excluded.stderr
    assert "5 training case(s) left out" in excluded.stdout


def test_cli_notes_a_structure_that_a_whole_group_lacks(tmp_path):
    dataset = _dataset(tmp_path / "Dataset001_Toy", n=12)
    table = tmp_path / "subgroups.tsv"
    table.write_text("case\tcondition\n" + "".join(f"case_{i:03d}\t{'a' if i < 10 else 'b'}\n" for i in range(12)))
    for case in ("case_010", "case_011"):
        _erase(dataset, case, 2)
    result = run_converter("audit-labels", "-i", dataset, "-groups", table, "--group-by", "condition", raw=tmp_path)
    assert result.returncode == 0 and "0 of 12 cases flagged" in result.stdout, result.stderr
    assert ("note: group b: none of its 2 cases has csf (the cohort: 10 of 12): taken as the group's anatomy, "
            "not flagged; open them if it is not") in result.stderr


@pytest.mark.parametrize("where, message", [
    ("folder", "is a folder; give a file name"),
    ("nowhere/audit.tsv", "does not exist"),
    ("audit.txt", "name the table .tsv (tab-separated) or .csv (comma-separated)"),
])
def test_cli_bad_output_is_one_line_exit_2_before_reading(tmp_path, where, message):
    dataset = _dataset(tmp_path / "Dataset001_Toy", n=3)
    (tmp_path / "folder").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = run_converter("audit-labels", "-i", dataset, "-o", tmp_path / where, raw=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_volumes_show_progress_when_asked_and_keep_the_case_order(tmp_path, capfd):
    """Issue 80 item 11: audit-labels read 30-40 cases in silence."""
    root = _dataset(tmp_path / "d", n=6)
    labels = {"wm": [1], "csf": [2]}
    shown = label_volumes(root / "labelsTr", labels, num_processes=2, progress=True)
    assert "Reading labels" in capfd.readouterr().err
    assert shown["case"].tolist() == [f"case_{i:03d}" for i in range(6)]
    silent = label_volumes(root / "labelsTr", labels, num_processes=1)
    assert capfd.readouterr().err == "" and silent.equals(shown)
