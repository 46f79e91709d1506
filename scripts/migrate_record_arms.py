"""Rename the arms a benchmark record stored under the names of the unreleased 0.1.0 to today's arm
names (a trainer's name without ``nnUNetTrainer``), once, so that the lab reads every record with one
set of names and keeps no aliases.

    python scripts/migrate_record_arms.py                 # data_docs/benchmark_record, in place
    python scripts/migrate_record_arms.py RECORD_FOLDER   # another record (a scratch run's)

Each ``runs/seed_*/arms/OLD`` folder becomes ``.../arms/NEW``, and every whole-word ``OLD`` in the
record's tables and reports (``.csv``, ``.tsv``, ``.json``, ``.md``, ``.txt``) becomes ``NEW``. The
lab journal, the record's README and the evidence narrative keep the names they were written with
(history); the figures (``.png``) keep the labels they were drawn with. A second run changes nothing.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "data_docs" / "benchmark_record"
#: the record's old arm name -> the arm of the same trainer today
RENAMES = {
    "Adaptive_f50_noIS_cap5": "DROAdaptive_fromStart",   # the default's setting before its ERM phase
    "Adaptive_f25_noIS_cap5": "DROAdaptive_f25_noIS_cap5",
    "DROAdaptive_untilLearned": "DROAdaptive",           # the ERM phase, a variant before it became the default
}
#: prose written at the time: it names the arms as they were then
HISTORY = ("journal.md", "README.md", "evidence_narrative.md")
SUFFIXES = (".csv", ".tsv", ".json", ".md", ".txt")
WORD = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, RENAMES)) + r")(?![\w])")


def migrate(record: Path) -> tuple[int, int]:
    """Rename ``record``'s old arms in place; return (folders renamed, files rewritten)."""
    folders = 0
    for arms in sorted(record.rglob("arms")):
        for old, new in RENAMES.items():
            if (arms / old).is_dir():
                if (arms / new).exists():
                    raise SystemExit(f"{arms / old}: {arms / new} exists too; resolve by hand")
                (arms / old).rename(arms / new)
                folders += 1
    files = 0
    for path in sorted(record.rglob("*")):
        if path.is_file() and path.suffix in SUFFIXES and path.name not in HISTORY:
            text = path.read_text()
            migrated = WORD.sub(lambda m: RENAMES[m.group(1)], text)
            if migrated != text:
                path.write_text(migrated)
                files += 1
    return folders, files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", nargs="?", default=str(RECORD), help=f"Default: {RECORD}")
    args = parser.parse_args(argv)
    record = Path(args.record)
    if not record.is_dir():
        parser.error(f"{record}: no such folder")
    folders, files = migrate(record)
    print(f"{record}: {folders} arm folders renamed, {files} files rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
