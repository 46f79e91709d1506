"""``scripts/error_sets.py`` on hand-made folders: the choice lines are the trainer's own (made by
``nnUNetTrainerDROAdaptive_errorSet._choice_line``, so a change of wording breaks this test, not the
reading), kept verbatim in the record, and counted by group beside JTT's set."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from nnunet_dro.errors import UserError
from nnunet_dro.training.error_set import nnUNetTrainerDROAdaptive_errorSet
from nnunet_dro.weighting.error_set import ErrorSetChoice
from script_modules import load_script

GROUPS = {"fetal_000": "control", "fetal_001": "control", "fetal_002": "control", "fetal_003": "other",
          "fetal_004": "other", "fetal_005": "spina_bifida"}
DATASET = "Dataset991_SyntheticFetalBenchmark"
FOLDER = "nnUNetTrainer{}_CPUBudget__nnUNetPlans__3d_fullres"


SCRIPT = load_script("error_sets")


def _line(cases: tuple[int, ...], epoch: int, why: str, tied: tuple[int, ...] = ()) -> str:
    """The line the trainer logs for a choice of ``cases`` (indices into GROUPS)."""
    host = SimpleNamespace(dro_case_ids=list(GROUPS), dro_settings=SimpleNamespace(error_fraction=0.2, upweight=5.0),
                           case_weighting=SimpleNamespace(selection_losses=lambda: np.linspace(0.9, 0.4, len(GROUPS))))
    choice = ErrorSetChoice(cases=cases, tied=tied, asked=2, boundary=0.5)
    return nnUNetTrainerDROAdaptive_errorSet._choice_line(host, choice, epoch, why)


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    """A working folder with one seed's two issue-79 runs (the refresh variant chose twice, its log
    written in two parts as a resumed run's) and a record with the seed's groups, JTT's weights and the
    runs' hardness reports."""
    work, record = tmp_path / "work", tmp_path / "record"
    results = work / "runs" / "seed_30" / "nnunet" / "nnUNet_results" / DATASET
    logs = {"DROAdaptive_errorSet": [[_line((3, 0), 57, "every structure's pseudo-Dice >= 0.5 at epoch 57")]],
            "DROAdaptive_errorSet_refresh70": [[_line((3, 1), 60, "every structure's pseudo-Dice >= 0.5 at epoch 60")],
                                               [_line((3, 4, 5), 139, "70 % of the 200 epochs reached (refresh)",
                                                      tied=(4, 5))]]}
    for arm, parts in logs.items():
        fold = results / FOLDER.format(arm) / "fold_all"
        fold.mkdir(parents=True)
        for number, lines in enumerate(parts):
            log = fold / f"training_log_2026_12_7_18_0{number}_00.txt"
            log.write_text("2026-12-07 18:00:00.0: epoch 1\n" + "".join(f"2026-12-07 18:30:00.0: {x}\n" for x in lines))
            os.utime(log, (1_000_000 + number, 1_000_000 + number))
    ermlike = results / "nnUNetTrainer_CPUBudget__nnUNetPlans__3d_fullres" / "fold_all"
    ermlike.mkdir(parents=True)
    (ermlike / "training_log_2026_12_7_18_00_00.txt").write_text("no error set here\n")
    seed = record / "runs" / "seed_30"
    raw = seed / "nnunet" / "nnUNet_raw" / DATASET
    raw.mkdir(parents=True)
    pd.DataFrame({"case": list(GROUPS) + ["fetal_100"], "condition": list(GROUPS.values()) + ["other"],
                  "split": ["train"] * len(GROUPS) + ["test"]}).to_csv(raw / "subgroups.tsv", sep="\t", index=False)
    (seed / "arms" / "JTT").mkdir(parents=True)
    pd.DataFrame({"case": list(GROUPS), "weight": [1.0, 5.0, 1.0, 5.0, 5.0, 1.0],
                  "score": [90.0, 40.0, 91.0, 30.0, 35.0, 88.0]}).to_csv(seed / "arms" / "JTT" / "case_weights.tsv",
                                                                       sep="\t", index=False)
    for arm, final in {"DROAdaptive_errorSet": {0, 3}, "DROAdaptive_errorSet_refresh70": {3, 4, 5}}.items():
        fold = seed / "nnunet" / "nnUNet_results" / DATASET / FOLDER.format(arm) / "fold_all"
        fold.mkdir(parents=True)
        pd.DataFrame({"case": list(GROUPS), "in_error_set": [int(i in final) for i in range(len(GROUPS))]}).to_csv(
            fold / "dro_hardness.csv", index=False)
    return work, record


def test_choices_are_kept_and_counted_by_group(tmp_path, capsys):
    work, record = _folders(tmp_path)
    assert SCRIPT.main(["--from", str(work), "--record", str(record)]) == 0
    assert "kept the choices of 2 runs" in capsys.readouterr().out
    kept = (record / "runs" / "seed_30" / "arms" / "DROAdaptive_errorSet_refresh70" / SCRIPT.CHOICES_FILE)
    assert len(kept.read_text().splitlines()) == 2  # both parts of the resumed run's log
    table = pd.read_csv(record / "error_sets.csv").set_index(["arm", "choice"])
    first = table.loc[("DROAdaptive_errorSet", 1)]
    assert (first["from_epoch"], first["size"], first["training_cases"]) == (58, 2, 6)
    assert (first["in_set_other"], first["train_other"], first["in_set_control"]) == (1, 2, 1)
    refresh = table.loc[("DROAdaptive_errorSet_refresh70", 2)]
    assert (refresh["from_epoch"], refresh["size"], refresh["in_set_other"], refresh["in_set_spina_bifida"]) == \
        (140, 3, 2, 1)
    assert refresh["why"] == "70 % of the 200 epochs reached (refresh)"
    assert table.loc[("DROAdaptive_errorSet_refresh70", 1), "cases"] == "fetal_003 fetal_001"
    jtt = table.loc[("JTT", 1)]
    assert (jtt["size"], jtt["in_set_other"], jtt["in_set_control"]) == (3, 2, 1) and pd.isna(jtt["from_epoch"])
    # the record alone gives the same table (the working folder can go)
    before = (record / "error_sets.csv").read_text()
    assert SCRIPT.main(["--record", str(record)]) == 0
    assert (record / "error_sets.csv").read_text() == before


def test_a_last_choice_the_hardness_report_does_not_mark_is_refused(tmp_path, capsys):
    work, record = _folders(tmp_path)
    report = next(record.glob("runs/seed_30/nnunet/nnUNet_results/*/*errorSet_CPU*/fold_all/dro_hardness.csv"))
    pd.DataFrame({"case": list(GROUPS), "in_error_set": [1, 0, 0, 0, 0, 0]}).to_csv(report, index=False)
    assert SCRIPT.main(["--from", str(work), "--record", str(record)]) == 2
    err = capsys.readouterr().err
    assert "dro_hardness.csv: in_error_set marks 1 cases, the last logged choice 2" in err
    assert not (record / "error_sets.csv").exists()


@pytest.mark.parametrize("line", ["DRO error set: restored, chosen at epoch 57: fetal_003",
                                  "DRO error set: at epoch 3: the hardest 20 % by stale loss, 3 of 6 cases, drawn 5 "
                                  "times as often as the others from epoch 4 on: fetal_003 (0.5000)"])
def test_lines_that_are_not_a_whole_choice_are_never_counted(line):
    """A restore line is not a choice; a choice line whose list disagrees with its count is refused."""
    if "restored" in line:
        assert SCRIPT.choice_lines(line) == []
    else:
        with pytest.raises(UserError, match="lists 1 cases but says 3"):
            SCRIPT.parse_choice(line)


def test_a_missing_working_folder_is_one_line(tmp_path, capsys):
    assert SCRIPT.main(["--from", str(tmp_path / "nowhere"), "--record", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: --from {tmp_path / 'nowhere'}: no such folder"
