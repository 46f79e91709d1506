"""Which training cases each error set held, by group: issue 79's trainers (the set chosen inside one
training, ``nnUNetTrainerDROAdaptive_errorSet`` and its ``_refresh70`` variant, which chooses twice)
beside Just Train Twice's (chosen by a finished ERM network's Dice, ``nnunet_dro jtt``). Part (a) of
issue 79's prediction (journal, December 6, evening) is read from it.

Usage (trains nothing; seconds)::

    python scripts/error_sets.py --from /work/results/decision200_79   # keep each run's choices in the record, then table
    python scripts/error_sets.py                                       # table from the record alone

``--from WORKDIR`` copies, for every seed of a working folder and every error-set run in it, the
training log's choice lines (``DRO error set: ...: the hardest ...``, verbatim) into the record as
``runs/seed_N/arms/ARM/error_set_choices.txt``: the record keeps no training log, and the checkpoint's
``dro_state['error_set']`` is gone with the working folder. The table is then made from the record
alone: one row per seed, arm and choice (JTT: one choice, the cases its ``case_weights.tsv`` weights
above 1), with the set's size, the training cases, and per group (the cohort's ``subgroups.tsv``,
split ``train``) how many of that group's training cases the set held. Written atomically to
``RECORD/error_sets.csv``.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from nnunet_dro.errors import UserError

RECORD = Path(__file__).resolve().parents[1] / "data_docs" / "benchmark_record" / "decision40_24_200"
CHOICES_FILE = "error_set_choices.txt"
#: the trainer's choice line (nnunet_dro.training.error_set, ``_choice_line``); a tie adds "; N cases tie ..."
CHOICE = re.compile(r"DRO error set: (?P<why>.+?): the hardest (?P<percent>[\d.]+) % by stale loss, "
                    r"(?P<size>\d+) of (?P<cases>\d+) cases, drawn (?P<upweight>[\d.]+) times as often as the "
                    r"others from epoch (?P<from_epoch>\d+) on: (?P<listed>[^;]*)")
#: a lab trainer's results folder -> its arm (the trainer's name without ``nnUNetTrainer`` and the lab's twin suffix)
TRAINER_FOLDER = re.compile(r"nnUNetTrainer(?P<arm>\w+?_errorSet\w*?)_CPUBudget__")
JTT_ARM, JTT_WEIGHTS = "JTT", "case_weights.tsv"


def choice_lines(log_text: str) -> list[str]:
    """The error-set choice lines of one training log, in order, without nnU-Net's timestamp.

    >>> choice_lines("2026-12-07 18:01:02.3: DRO error set: at epoch 3: the hardest 20 % by stale loss, 1 of 5 "
    ...              "cases, drawn 5 times as often as the others from epoch 4 on: c1 (0.5000)\\nother line")
    ['DRO error set: at epoch 3: the hardest 20 % by stale loss, 1 of 5 cases, drawn 5 times as often as the others from epoch 4 on: c1 (0.5000)']
    """
    return [line[line.index("DRO error set: "):] for line in log_text.splitlines() if CHOICE.search(line)]


def parse_choice(line: str) -> dict:
    """One choice line -> the epoch its weights start, why, the fraction, upweight and the chosen cases.

    >>> parse_choice("DRO error set: 70 % of the 10 epochs reached (refresh): the hardest 20 % by stale loss, 2 of 8 "
    ...              "cases, drawn 5 times as often as the others from epoch 8 on: a (0.9000), b (0.8000)")["cases"]
    ['a', 'b']
    """
    match = CHOICE.search(line)
    if match is None:
        raise UserError(f"not an error-set choice line: {line[:80]!r}")
    cases = [item.split(" (")[0].strip() for item in match["listed"].split("), ") if item.strip()]
    if len(cases) != int(match["size"]):
        raise UserError(f"choice line lists {len(cases)} cases but says {match['size']}: {line[:80]!r}")
    return {"from_epoch": int(match["from_epoch"]), "why": match["why"], "error_fraction": float(match["percent"]) / 100,
            "upweight": float(match["upweight"]), "cases": cases}


def run_logs(fold: Path) -> list[Path]:
    """A run's training logs, oldest first (nnU-Net starts a new one on each start or resume)."""
    return sorted(fold.glob("training_log_*.txt"), key=lambda p: p.stat().st_mtime)


def keep_choices(workdir: Path, record: Path) -> list[Path]:
    """Copy every error-set run's choice lines from ``workdir``'s training logs into ``record``."""
    written = []
    for fold in sorted(workdir.glob("runs/seed_*/nnunet/nnUNet_results/*/*/fold_*")):
        match = TRAINER_FOLDER.match(fold.parent.name)
        logs = run_logs(fold) if match else []
        if not logs:
            continue
        # every log of the run, in order: a resumed run's later log has only the restore, not the choice
        lines = [line for path in logs for line in choice_lines(path.read_text())]
        if not lines:
            raise UserError(f"{logs[-1]}: no error-set choice line (did the run end its ERM phase?)")
        seed_folder = fold.parents[4]
        target = record / "runs" / seed_folder.name / "arms" / match["arm"] / CHOICES_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".txt.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(target)
        written.append(target)
    return written


def final_set_agrees(seed_folder: Path, arm: str, cases: list[str]) -> None:
    """The last choice must be the set the run's ``dro_hardness.csv`` marks (``in_error_set``), where
    the record keeps it: a check that the log lines were read right."""
    for report in seed_folder.glob(f"nnunet/nnUNet_results/*/nnUNetTrainer{arm}_CPUBudget__*/fold_*/dro_hardness.csv"):
        table = pd.read_csv(report, dtype={"case": str})
        marked = set(table.loc[table["in_error_set"] == 1, "case"])
        if marked != set(cases):
            raise UserError(f"{report}: in_error_set marks {len(marked)} cases, the last logged choice {len(cases)}")


def training_groups(seed_folder: Path) -> pd.Series:
    """Case -> group (condition) of the seed's training cases."""
    tables = sorted(seed_folder.glob("nnunet/nnUNet_raw/*/subgroups.tsv"))
    if not tables:
        raise UserError(f"{seed_folder}: no nnunet/nnUNet_raw/*/subgroups.tsv")
    table = pd.read_csv(tables[0], sep="\t", dtype={"case": str})
    return table[table["split"] == "train"].set_index("case")["condition"]


def error_set_table(record: Path) -> pd.DataFrame:
    """One row per seed, arm and choice: the set's size and, per group, the set's cases of that group
    (``in_set_<group>``) out of its training cases (``train_<group>``)."""
    rows = []
    for seed_folder in sorted(record.glob("runs/seed_*"), key=lambda p: int(p.name.split("_")[1])):
        sets = []
        for path in sorted(seed_folder.glob(f"arms/*/{CHOICES_FILE}")):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                choice = parse_choice(line)
                sets.append((path.parent.name, number, choice["from_epoch"], choice["why"], choice["cases"]))
            final_set_agrees(seed_folder, path.parent.name, sets[-1][4])
        weights = seed_folder / "arms" / JTT_ARM / JTT_WEIGHTS
        if weights.is_file():
            table = pd.read_csv(weights, sep="\t", dtype={"case": str})
            sets.append((JTT_ARM, 1, pd.NA, "a finished ERM network's Dice", table.loc[table["weight"] > 1, "case"].tolist()))
        if not sets:
            continue
        groups = training_groups(seed_folder)
        for arm, number, from_epoch, why, cases in sets:
            unknown = sorted(set(cases) - set(groups.index))
            if unknown:
                raise UserError(f"{seed_folder}: {arm}'s set names cases that are not training cases: {unknown[:3]}")
            chosen = groups.loc[cases]
            row = {"seed": int(seed_folder.name.split("_")[1]), "arm": arm, "choice": number,
                   "from_epoch": from_epoch, "why": why, "size": len(cases), "training_cases": len(groups)}
            for group in sorted(groups.unique()):
                row[f"in_set_{group}"] = int((chosen == group).sum())
                row[f"train_{group}"] = int((groups == group).sum())
            row["cases"] = " ".join(cases)
            rows.append(row)
    if not rows:
        raise UserError(f"{record}: no error set (no runs/seed_*/arms/*/{CHOICES_FILE}, no JTT {JTT_WEIGHTS})")
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="workdir", type=Path, metavar="WORKDIR",
                        help="a working folder whose error-set runs' choice lines are first kept in the record")
    parser.add_argument("--record", type=Path, default=RECORD, help=f"default: {RECORD}")
    args = parser.parse_args(argv)
    try:
        if args.workdir is not None:
            if not args.workdir.is_dir():
                raise UserError(f"--from {args.workdir}: no such folder")
            kept = keep_choices(args.workdir, args.record)
            print(f"kept the choices of {len(kept)} runs in {args.record}")
        table = error_set_table(args.record)
    except (UserError, OSError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    output = args.record / "error_sets.csv"
    tmp = output.with_suffix(".csv.tmp")
    table.to_csv(tmp, index=False)
    tmp.replace(output)
    print(table.drop(columns=["cases", "why"]).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
