"""The real ``nnunet_dro evaluate`` CLI in subprocesses: a full run and every kind of bad input."""
import gzip
import json

import numpy as np
import pandas as pd
import pytest

from eval_testdata import make_cohort, run_cli, write_label_map

PREFIX = "nnunet_dro evaluate: error: "


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    ref, preds = make_cohort(root, n_cases=4, methods=("ERM", "DRO"))
    (root / "groups.tsv").write_text("case\tcondition\tga\n" + "".join(
        f"case_{i:03d}\t{'sb' if i % 2 else 'control'}\t{21 + 4 * i}\n" for i in range(4)))
    return root, ref, preds


def test_full_run_with_process_pool(cohort, tmp_path):
    root, ref, preds = cohort
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"ERM={preds['ERM']}", f"DRO={preds['DRO']}", "-o", out,
                   "-groups", root / "groups.tsv", "--group-by", "condition", "ga:20,28,40",
                   "--metrics", "dice", "vs", "--percentiles", "25", "10", "-np", "2", "--bootstrap", "50")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "| group | method | region | n | mean | std | median | iqr | p25 | p10 |" in done.stdout
    assert "--empty one" in done.stdout  # the policy is printed with the table
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["group_column"]) == {"all", "condition", "ga"}
    assert set(summary["group"]) == {"all", "control", "sb", "[20,28)", "[28,40)"}
    assert (summary.query("group == 'all'")["n"] == 4).all()
    assert (out / "comparison.csv").is_file() and (out / "boxplots_vs.png").is_file()
    comparison = pd.read_csv(out / "comparison.csv")
    assert {"p10_difference_ci_low", "p10_difference_ci_high"} <= set(comparison.columns)
    ci = comparison.dropna(subset=["p10_difference_ci_low"])
    assert not ci.empty and (ci["p10_difference_ci_low"] <= ci["p10_difference_ci_high"]).all()
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["regions"] == {"1": [1], "2": [2], "3": [3]} and settings["num_processes"] == 2
    # the process pool and one process (in this process) give the same numbers
    from nnunet_dro.evaluation import evaluate
    single = evaluate(str(ref), {"ERM": str(preds["ERM"]), "DRO": str(preds["DRO"])}, None,
                      groups=str(root / "groups.tsv"), group_by=["condition", "ga:20,28,40"], metrics=["dice", "vs"],
                      percentiles=[25, 10], num_processes=1, progress=False)
    written = pd.read_csv(out / "per_case.csv", keep_default_na=False, na_values=[""])
    np.testing.assert_allclose(written["value"], single.per_case["value"], rtol=1e-12)
    assert written["case"].tolist() == single.per_case["case"].tolist()


def _bad_inputs(root, ref, preds):
    """(name, arguments, expected message) for each kind of bad input; writes the files it needs."""
    bad = root / "bad"
    bad.mkdir(exist_ok=True)
    (bad / "empty").mkdir(exist_ok=True)
    corrupt = bad / "corrupt"
    corrupt.mkdir(exist_ok=True)
    for i in range(4):
        (corrupt / f"case_{i:03d}.nii.gz").write_bytes(b"this is not a nifti file")
    truncated = bad / "truncated"
    truncated.mkdir(exist_ok=True)
    for i in range(4):
        data = (preds["ERM"] / f"case_{i:03d}.nii.gz").read_bytes()
        (truncated / f"case_{i:03d}.nii.gz").write_bytes(data[: len(data) // 2])
    truncated_nii = bad / "truncated_nii"  # plain .nii: nibabel's message was two lines
    truncated_nii.mkdir(exist_ok=True)
    for i in range(4):
        plain = gzip.decompress((preds["ERM"] / f"case_{i:03d}.nii.gz").read_bytes())
        (truncated_nii / f"case_{i:03d}.nii").write_bytes(plain[:-100])
    not_gzip = bad / "not_gzip"
    not_gzip.mkdir(exist_ok=True)
    for i in range(4):
        (not_gzip / f"case_{i:03d}.nii.gz").write_bytes(gzip.compress(b"\0" * 40))
    shape = bad / "shape"
    unknown = bad / "unknown_label"
    for i in range(4):
        write_label_map(shape / f"case_{i:03d}.nii.gz", np.zeros((16, 16, 15), np.uint8), spacing=(1.0, 1.0, 2.0))
        arr = np.zeros((16, 16, 16), np.uint8)
        arr[0, 0, 0] = 9
        write_label_map(unknown / f"case_{i:03d}.nii.gz", arr, spacing=(1.0, 1.0, 2.0))
    spacing = bad / "spacing"
    partial = bad / "partial"
    for i in range(4):
        write_label_map(spacing / f"case_{i:03d}.nii.gz", np.zeros((16, 16, 16), np.uint8), spacing=(1.0, 1.0, 1.0))
        if i != 2:
            (partial / f"case_{i:03d}.nii.gz").parent.mkdir(exist_ok=True)
            (partial / f"case_{i:03d}.nii.gz").write_bytes((preds["ERM"] / f"case_{i:03d}.nii.gz").read_bytes())
    (bad / "malformed.csv").write_text("case,condition\ncase_000,a,extra\n")
    (bad / "duplicates.csv").write_text("case,condition\ncase_000,a\ncase_000,b\n")
    ok = [f"A={preds['ERM']}"]
    return [
        ("missing reference folder", ["-ref", bad / "nope", "-pred", *ok], "reference folder does not exist"),
        ("missing prediction folder", ["-ref", ref, "-pred", f"A={bad / 'nope'}"],
         "prediction folder of A does not exist"),
        ("empty reference folder", ["-ref", bad / "empty", "-pred", *ok], "contains no segmentation files"),
        ("empty prediction folder", ["-ref", ref, "-pred", f"A={bad / 'empty'}"], "contains no segmentation files"),
        ("corrupt file", ["-ref", ref, "-pred", f"A={corrupt}"], "cannot read"),
        ("truncated file", ["-ref", ref, "-pred", f"A={truncated}"], "truncated file: the gzip stream ends after"),
        ("truncated plain nii", ["-ref", ref, "-pred", f"A={truncated_nii}"],
         "truncated file: the file holds 4348 of the 4448 bytes its header promises (352-byte header + 4096 "
         "voxels of uint8); the download or copy is incomplete"),
        ("gzip of garbage", ["-ref", ref, "-pred", f"A={not_gzip}"], "cannot read"),
        ("shape mismatch", ["-ref", ref, "-pred", f"A={shape}"], "shape mismatch"),
        ("spacing mismatch", ["-ref", ref, "-pred", f"A={spacing}"], "spacing mismatch"),
        ("unknown label", ["-ref", ref, "-pred", f"A={unknown}"], "label value 9"),
        ("label outside preset", ["-ref", ref, "-pred", *ok, "-regions", "brats"], "label value 3"),
        ("missing prediction", ["-ref", ref, "-pred", f"A={partial}"], "A has no prediction for 1 case(s): case_002"),
        ("malformed group table", ["-ref", ref, "-pred", *ok, "-groups", bad / "malformed.csv"],
         "malformed group table"),
        ("duplicate case rows", ["-ref", ref, "-pred", *ok, "-groups", bad / "duplicates.csv"], "duplicate rows"),
        ("unknown group column", ["-ref", ref, "-pred", *ok, "-groups", root / "groups.tsv", "--group-by", "site"],
         "no group column 'site'"),
        ("unknown region preset", ["-ref", ref, "-pred", *ok, "-regions", "fetal"], "unknown region preset 'fetal'"),
        ("bad percentile", ["-ref", ref, "-pred", *ok, "--percentiles", "120"], "not between 0 and 100"),
        ("duplicate method", ["-ref", ref, "-pred", *ok, *ok], "given twice"),
    ]


BAD_INPUT_NAMES = ["missing reference folder", "missing prediction folder", "empty reference folder",
                   "empty prediction folder", "corrupt file", "truncated file", "truncated plain nii", "gzip of garbage", "shape mismatch",
                   "spacing mismatch", "unknown label", "label outside preset", "missing prediction",
                   "malformed group table", "duplicate case rows", "unknown group column", "unknown region preset",
                   "bad percentile", "duplicate method"]


@pytest.mark.parametrize("name", BAD_INPUT_NAMES)
def test_bad_input_one_line_exit_2_no_output(cohort, tmp_path, name):
    root, ref, preds = cohort
    cases = {case[0]: case[1:] for case in _bad_inputs(root, ref, preds)}
    assert sorted(cases) == sorted(BAD_INPUT_NAMES)
    args, message = cases[name]
    out = tmp_path / "out"
    # one process except for a file error, which must also come back cleanly from the process pool
    done = run_cli(*args, "-o", out, "-np", "2" if name == "corrupt file" else "1")
    assert done.returncode == 2, (name, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, name
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(PREFIX) and message in last, (name, last)
    assert not out.exists(), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], name
