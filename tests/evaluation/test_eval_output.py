"""The report folder of the real ``nnunet_dro evaluate`` CLI: checked before any case is read,
updated by one atomic swap, and left as it was when a run fails (even half-way through writing)."""
from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from eval_testdata import PYTHON, make_cohort, run_cli

PREFIX = "nnunet_dro evaluate: error: "


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("output")
    ref, preds = make_cohort(root, n_cases=4, methods=("A", "B"))
    return ref, preds


def _args(cohort, *methods):
    ref, preds = cohort
    return ["-ref", ref, "-pred", *[f"{m}={preds[m]}" for m in methods or ("A", "B")], "-np", "1"]


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path below ``folder`` with its content (None for folders)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def _one_line_error(done) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), done.stderr
    assert "Reading cases" not in done.stderr  # checked before any case was read
    return lines[0][len(PREFIX):]


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write in: permission bits, or /sys for the superuser."""
    if os.geteuid() != 0:
        folder = tmp_path / "read_only"
        folder.mkdir()
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        return folder
    return Path("/sys")  # sysfs: even root cannot create a folder there


def test_output_is_a_file(cohort, tmp_path):
    out = tmp_path / "report.csv"
    out.write_text("mine\n")
    message = _one_line_error(run_cli(*_args(cohort), "-o", out))
    assert message == f"-o {out}: exists and is not a folder"
    assert out.read_text() == "mine\n"


def test_output_below_a_file(cohort, tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    out = tmp_path / "notes.txt" / "sub" / "report"
    message = _one_line_error(run_cli(*_args(cohort), "-o", out))
    assert message == f"-o {out}: {tmp_path / 'notes.txt'} is a file, not a folder"


def test_output_not_writable(cohort, tmp_path):
    parent = _unwritable_folder(tmp_path)
    out = parent / "nnunet_dro_report"
    message = _one_line_error(run_cli(*_args(cohort), "-o", out))
    assert message.startswith(f"-o {out}: cannot write in {parent} ("), message
    assert not out.exists()


def test_existing_folder_with_a_folder_named_like_a_report_file(cohort, tmp_path):
    out = tmp_path / "report"
    (out / "per_case.csv").mkdir(parents=True)
    (out / "per_case.csv" / "keep.txt").write_text("mine\n")
    (out / "summary.csv").write_text("previous\n")
    before = _tree(out)
    message = _one_line_error(run_cli(*_args(cohort), "-o", out))
    assert message == (f"-o {out}: {out / 'per_case.csv'} is a folder, but the report writes a file of that "
                       f"name; rename or remove it")
    assert _tree(out) == before


def test_update_swaps_the_whole_report_and_keeps_other_files(cohort, tmp_path):
    out = tmp_path / "report"
    first = run_cli(*_args(cohort, "A", "B"), "-o", out, "--metrics", "dice", "vs")
    assert first.returncode == 0, first.stderr
    assert (out / "comparison.csv").is_file() and (out / "boxplots_vs.png").is_file()
    (out / "notes.txt").write_text("mine\n")
    (out / "figures").mkdir()
    (out / "figures" / "fig1.txt").write_text("mine too\n")
    inode_of_notes = (out / "notes.txt").stat().st_ino
    second = run_cli(*_args(cohort, "B"), "-o", out)
    assert second.returncode == 0, second.stderr
    # Only this run's report (no comparison.csv, no VS box plot of the first run) and the user's files.
    assert sorted(p.name for p in out.iterdir()) == [
        "boxplots_dice.png", "figures", "notes.txt", "per_case.csv", "report.html", "summary.csv", "summary.json",
        "table.md", "table.tex"]
    assert set(pd.read_csv(out / "per_case.csv")["method"]) == {"B"}
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "figures" / "fig1.txt").read_text() == "mine too\n"
    assert (out / "notes.txt").stat().st_ino == inode_of_notes  # carried over as a hard link, not copied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary folder beside it


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write() instead of a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))


@pytest.fixture(scope="module")
def matplotlib_config(tmp_path_factory) -> Path:
    """A matplotlib config folder with its font cache already built (the cache is larger than the
    file size limit below)."""
    folder = tmp_path_factory.mktemp("mplconfig")
    subprocess.run([str(PYTHON), "-c", "import matplotlib.pyplot"], check=True, timeout=120,
                   env=dict(os.environ, MPLCONFIGDIR=str(folder)))
    return folder


def _run_with_file_size_limit(cohort, out, matplotlib_config) -> str:
    """The CLI with files limited to 20 kB (like a full disk): the box plot PNG fails to be written
    after the CSV files were. Returns the one line it printed."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", MPLCONFIGDIR=str(matplotlib_config))
    done = subprocess.run([str(PYTHON), "-m", "nnunet_dro", "evaluate", *map(str, _args(cohort, "A", "B")),
                           "-o", str(out)], capture_output=True, text=True, env=env, timeout=120,
                          preexec_fn=_limit_file_size)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.replace("\r", "\n").splitlines()
             if line.strip() and not line.lstrip().startswith("Reading cases")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_failure_while_writing_leaves_the_previous_report_intact(cohort, tmp_path, matplotlib_config):
    out = tmp_path / "report"
    first = run_cli(*_args(cohort, "A"), "-o", out)
    assert first.returncode == 0, first.stderr
    (out / "notes.txt").write_text("mine\n")
    before = _tree(out)
    assert max(len(content) for content in before.values() if content) > 20_000  # the PNG
    line = _run_with_file_size_limit(cohort, out, matplotlib_config)
    assert line.startswith(f"{PREFIX}-o {out}: cannot write the report (File too large") and \
        line.endswith("; the previous report is unchanged"), line
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_failure_while_writing_a_new_report_leaves_nothing(cohort, tmp_path, matplotlib_config):
    out = tmp_path / "new" / "deeper" / "report"
    line = _run_with_file_size_limit(cohort, out, matplotlib_config)
    assert line.startswith(f"{PREFIX}-o {out}: cannot write the report (File too large") and \
        line.endswith("; nothing was written"), line
    assert list(tmp_path.iterdir()) == []  # not even the parent folders


def test_report_into_the_current_folder(cohort, tmp_path):
    """``-o .``: the folder cannot be swapped under the user's feet; each file is renamed into it."""
    (tmp_path / "notes.txt").write_text("mine\n")
    done = run_cli(*_args(cohort, "A"), "-o", ".", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "per_case.csv").is_file() and (tmp_path / "notes.txt").read_text() == "mine\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
