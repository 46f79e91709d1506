"""Benchmark figures stated in the README and docs/evidence.md are the stored record's: a table
re-made from the record (``--report-only``) that changes, or a page edited by hand, fails here
instead of letting the pages drift apart. The record's ``summary.md`` is what ``--report-only``
writes from the kept files (its own test re-makes it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "data_docs" / "benchmark_record" / "robustness177_240" / "summary.md"
EVIDENCE = ROOT / "docs" / "evidence.md"
README = ROOT / "README.md"
#: record arm -> the row label docs/evidence.md gives it
EVIDENCE_ROWS = {
    "ERM": "ERM (Dice)",
    "Adaptive_f50_noIS_cap5": "`_fromStart` (the default until November 27, 2026) - ERM",
    "GroupBalanced": "balanced sampling (knows the groups) - ERM, 2 seeds",
    "Adaptive_f25_noIS_cap5": "f = 0.25 with the cap - ERM, 2 seeds",
    "DROAdaptive_untilLearned": "default `nnUNetTrainerDROAdaptive` (ERM phase, then `_fromStart`) - ERM, 3 seeds",
}
COLUMNS = ["spina_bifida cerebellum p10", "other intra_axial_csf p10", "control white_matter mean",
           "control intra_axial_csf mean", "control cerebellum mean"]


def table_rows(lines: list[str], header_start: str) -> dict[str, dict[str, str]]:
    """The markdown table whose header begins with ``header_start``: first cell -> {column: cell}."""
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = {}
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip().strip("|").split("|")]
                rows[cells[0]] = dict(zip(header, cells))
            return rows
    raise AssertionError(f"no table starting with {header_start!r}")


def record_section_rows(summary: Path, heading: str) -> dict[str, dict[str, str]]:
    """The first table under ``heading`` in a record's ``summary.md``: arm -> {column: cell}."""
    text = summary.read_text().split(heading, 1)[1]
    return table_rows(text.splitlines(), "| arm |")


def record_large_test_rows(summary: Path = RECORD) -> dict[str, dict[str, str]]:
    """The larger-test table of a record's ``summary.md``: arm -> {column: cell}."""
    return record_section_rows(summary, "## On a larger test set")


def test_evidence_headline_is_the_records_larger_test_table():
    record = record_large_test_rows()
    page = table_rows(EVIDENCE.read_text().splitlines(), "| 240 epochs, 4 seeds")
    for arm, label in EVIDENCE_ROWS.items():
        assert label in page, f"docs/evidence.md lost the row {label!r}"
        for column in COLUMNS:
            assert page[label][column] == record[arm][column], (arm, column)


def test_readme_figures_are_the_records():
    default = record_large_test_rows()["Adaptive_f50_noIS_cap5"]
    readme = README.read_text()
    for column, row_text in (("other intra_axial_csf p10", '"other" group, intra-axial CSF p10'),
                             ("spina_bifida cerebellum p10", "spina bifida group, cerebellum p10")):
        assert f"| {row_text} | {default[column]} |" in readme, column
    controls = [float(re.match(r"[+-]?\d+\.\d+", default[c]).group()) for c in COLUMNS[2:]]
    assert "| controls, mean of each region | within 0.5 |" in readme
    assert max(abs(v) for v in controls) <= 0.5


#: record arm -> the row label of the alternatives table in docs/evidence.md
ALTERNATIVE_ROWS = {
    "ERM": "ERM (Dice)",
    "ERM_repeat": "ERM trained again (`ERM_repeat`, a rerun: no method) - ERM",
    "DROAdaptive_untilLearned": "default `nnUNetTrainerDROAdaptive` - ERM",
    "DROAdaptive_repeat": "the default trained again as the alternatives were (`DROAdaptive_repeat`) - ERM",
    "DiceTopK10": "`nnUNetTrainerDiceTopK10Loss` - ERM",
    "TopK10": "`nnUNetTrainerTopk10Loss` - ERM",
    "Oversample033": "`nnUNetTrainer_probabilisticOversampling_033` - ERM",
    "JTT": "Just Train Twice (`nnunet_dro jtt`, two trainings) - ERM",
    "DROAdaptive_trim5": "`nnUNetTrainerDROAdaptive_trim5` (outlier trim) - ERM",
}
#: record arm -> the row label of the label-noise table in docs/evidence.md
NOISE_ROWS = {
    "ERM": "ERM (Dice)",
    "DROAdaptive": "default `nnUNetTrainerDROAdaptive` - ERM",
    "DROAdaptive_trim5": "`nnUNetTrainerDROAdaptive_trim5` (outlier trim) - ERM",
}


def test_evidence_alternatives_table_is_its_records_larger_test_table():
    """The comparison with nnU-Net's own trainers in docs/evidence.md is the ``alternatives177_240``
    record's larger-test table, cell by cell; the README quotes the same cells."""
    record = record_large_test_rows(ROOT / "data_docs" / "benchmark_record" / "alternatives177_240" / "summary.md")
    page = table_rows(EVIDENCE.read_text().splitlines(), "| 177 cases, 240 epochs, seeds 13-15, 300 further")
    for arm, label in ALTERNATIVE_ROWS.items():
        for column in ("seeds", *COLUMNS):
            assert page[label][column] == record[arm][column], (arm, column)
    readme = " ".join(README.read_text().split())
    for arm in ("DROAdaptive_untilLearned", "DiceTopK10", "JTT"):
        for column in ("other intra_axial_csf p10", "spina_bifida cerebellum p10"):
            assert record[arm][column].split()[0] in readme, (arm, column)


def test_evidence_label_noise_table_is_its_records():
    """The label-noise table in docs/evidence.md is the ``noise177_240`` record's larger-test table
    and its share of draws on the noisy cases, cell by cell."""
    summary = RECORDS / "noise177_240" / "summary.md"
    record = record_large_test_rows(summary)
    shares = record_section_rows(summary, "## Label noise: are the noisy cases chased?")
    page = table_rows(EVIDENCE.read_text().splitlines(), "| 177 cases, 8 with wrong labels, 240 epochs")
    for arm, label in NOISE_ROWS.items():
        assert label in page, f"docs/evidence.md lost the row {label!r}"
        for column in ("seeds", *COLUMNS):
            assert page[label][column] == record[arm][column], (arm, column)
        assert page[label]["noisy cases' share of draws (x uniform)"] == \
            f"{shares[arm]['share of draws on them']} ({shares[arm]['x uniform']})", arm


@pytest.mark.parametrize("page", [README, EVIDENCE])
def test_pages_state_the_headline_seeds_of_the_record(page):
    seeds = re.search(r"Seeds ([\d, ]+): every arm's final network", RECORD.read_text()).group(1)
    assert len(seeds.split(",")) == 4
    assert "four" in page.read_text() or "4 seeds" in page.read_text()


def test_evidence_gpu_table_is_the_recorded_gpu_check():
    """The GPU cost table of docs/evidence.md is the recorded gpu_check.json of the H200 run."""
    import json

    record = json.loads((ROOT / "data_docs" / "benchmark_record" / "gpu_check_h200" / "gpu_check.json").read_text())
    assert record["device"] == "NVIDIA H200"
    timing = record["timing"]
    page = table_rows(EVIDENCE.read_text().splitlines(), "| trainer | median of paired ratios")
    assert page["`nnUNetTrainer`"]["median of paired ratios to nnU-Net (IQR)"] == \
        f"{1e3 * timing['median_seconds']['nnUNetTrainer']:.1f} ms per iteration"
    for name, entry in timing["ratios"].items():
        row = page[f"`{name}`"]
        q1, q3 = entry["paired_ratio_iqr"]
        assert row["median of paired ratios to nnU-Net (IQR)"] == \
            f"{entry['median_paired_ratio']:.3f} ({q1:.3f}-{q3:.3f})", name
        assert row["ratio of medians"] == f"{entry['ratio_of_medians']:.3f}", name
        assert row["epoch end, per 250 iterations"] == \
            f"+{1e3 * entry['epoch_end_seconds']:.0f} ms ({entry['epoch_end_ratio_250_iterations']:.3f} x)", name


RECORDS = ROOT / "data_docs" / "benchmark_record"
#: the small-cohort tables of docs/evidence.md: (first cell of the header row, record folder, seeds)
SMALL_COHORT_TABLES = [
    ("| 64-case cohort, 120 epochs |", RECORDS / "stability64", range(4)),
    ("| 40-case cohort, 240 epochs |", RECORDS / "stability40_240", range(4)),
    ("| 64-case cohort, 240 epochs |", RECORDS / "stability64_240", range(4)),
]
#: a small-cohort table's row label in docs/evidence.md -> (condition, region, statistic)
STABILITY_ROWS = {
    "default - ERM: spina_bifida cerebellum p10": [("spina_bifida", "cerebellum", "p10")],
    "default - ERM: other cerebellum p10": [("other", "cerebellum", "p10")],
    "default - ERM: other intra-axial CSF p10": [("other", "intra_axial_csf", "p10")],
    "default - ERM: control means (WM / CSF / cerebellum)": [
        ("control", region, "mean") for region in ("white_matter", "intra_axial_csf", "cerebellum")],
}


@pytest.mark.parametrize("header, record, seeds", SMALL_COHORT_TABLES)
def test_evidence_small_cohort_tables_are_their_records(header, record, seeds):
    """Each seed's paired difference in a small-cohort table of docs/evidence.md is the record's
    (``summary_by_seed.csv``, the 30 first test cases), and so are the learning epochs and lost epochs."""
    import pandas as pd

    rows = table_rows(EVIDENCE.read_text().splitlines(), header)
    by_seed = pd.read_csv(record / "summary_by_seed.csv").set_index(["seed", "method", "group", "region"])
    runs = pd.read_csv(record / "runs.csv").set_index(["arm", "seed"])
    for seed in seeds:
        column = f"seed {seed}"
        for label, cells in STABILITY_ROWS.items():
            expected = " / ".join(
                f"{by_seed.loc[(seed, 'DROAdaptive', group, region), stat] - by_seed.loc[(seed, 'ERM', group, region), stat]:+.1f}"
                for group, region, stat in cells)
            assert rows[label][column] == expected, (label, column)
        learned = " / ".join(str(int(runs.loc[(arm, seed), "all_learned_epoch"])) for arm in ("ERM", "DROAdaptive"))
        assert rows["every structure at pseudo-Dice 0.2 from epoch: ERM / default"][column] == learned
        lost = " / ".join(str(int(runs.loc[(arm, seed), "lost_epochs"])) for arm in ("ERM", "DROAdaptive"))
        assert rows["learned-structure lost epochs: ERM / default"][column] == lost


STABILITY_LARGE_ROWS = {
    "the same on 100 further test cases per group: spina_bifida cerebellum p10": STABILITY_ROWS[
        "default - ERM: spina_bifida cerebellum p10"],
    "other cerebellum p10": STABILITY_ROWS["default - ERM: other cerebellum p10"],
    "other intra-axial CSF p10": STABILITY_ROWS["default - ERM: other intra-axial CSF p10"],
    "control means (WM / CSF / cerebellum)": STABILITY_ROWS["default - ERM: control means (WM / CSF / cerebellum)"],
}


@pytest.mark.parametrize("header, record, seeds", SMALL_COHORT_TABLES)
def test_evidence_small_cohort_larger_test_rows_are_the_records(header, record, seeds):
    """A small-cohort table's rows on 100 further test cases per group, re-computed with the
    evaluation's own ``summarize`` from the record's per-case Dice (``per_case_large_test.csv``)."""
    import pandas as pd

    from nnunet_dro.evaluation.stats import summarize

    rows = table_rows(EVIDENCE.read_text().splitlines(), header)

    tables = {(seed, arm): pd.read_csv(record / "runs" / f"seed_{seed}" / "arms" / arm / "per_case_large_test.csv")
              for seed in seeds for arm in ("ERM", "DROAdaptive")}

    def statistic(seed, arm, group, region, stat):
        table = tables[(seed, arm)]
        values = table[(table.metric == "dice") & (table.condition == group) & (table.region == region)].value
        return summarize(values, [10])[stat]

    for seed in seeds:
        for label, cells in STABILITY_LARGE_ROWS.items():
            expected = " / ".join(f"{statistic(seed, 'DROAdaptive', *cell) - statistic(seed, 'ERM', *cell):+.1f}"
                                  for cell in cells)
            assert rows[label][f"seed {seed}"] == expected, (label, seed)
