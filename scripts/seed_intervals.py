"""Per-seed paired differences of the benchmark record, with intervals over seeds (lab script).

For every record folder under data_docs/benchmark_record/ and every per-case file there
(``per_case.csv``: the benchmark's test cases; ``per_case_large_test.csv``: the further test
cases), every arm, group, region and statistic (mean, median, p25, p10, p5 of Dice): the
difference to ERM seed by seed (the same seed's test cases, the cases both scored), its mean over
seeds, the 95 % t-interval over seeds (Student t, k - 1 degrees of freedom; none with one seed),
the sign count; where the record has an ERM rerun, every arm against it too (kind "arm against
ERM_repeat", its seeds only: like for like); and the noise floor where the record has reruns: ``ERM_repeat - ERM`` and
``DROAdaptive_repeat - DROAdaptive_untilLearned`` (the default trained twice), seed by seed.
The statistics are those of ``nnunet_dro evaluate --paired-runs`` (nnunet_dro.evaluation.runs).

    python scripts/seed_intervals.py            # writes data_docs/benchmark_record/seed_intervals.csv
    python scripts/seed_intervals.py --print "other,intra_axial_csf,p10" "spina_bifida,cerebellum,p10"
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from nnunet_dro.atomic import write_text_atomic
from nnunet_dro.evaluation.runs import paired_differences, sign_count, statistic_names, t_interval

RECORD = Path(__file__).resolve().parents[1] / "data_docs" / "benchmark_record"
REFERENCE = "ERM"
REPEATS = {"ERM_repeat": "ERM", "DROAdaptive_repeat": "DROAdaptive_untilLearned"}  # rerun -> its first run
STATISTICS = statistic_names([25, 10, 5])
NOT_GROUPS = {"method", "case", "region", "metric", "value", "empty_policy", "missing_policy", "note", "seed"}


def per_seed_matrices(frame: pd.DataFrame, method: str, reference: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Seeds both methods have, and two seeds x cases arrays (each seed's own test cases, NaN padded)."""
    seeds = sorted(set(frame.loc[frame["method"] == method, "seed"]) & set(frame.loc[frame["method"] == reference,
                                                                                      "seed"]))
    rows_a, rows_b = [], []
    for seed in seeds:
        wide = frame[frame["seed"] == seed].pivot(index="case", columns="method", values="value")
        rows_a.append(wide[method].to_numpy(float))
        rows_b.append(wide[reference].to_numpy(float))
    width = max((len(r) for r in rows_a), default=0)
    pad = lambda rows: np.array([np.pad(r, (0, width - len(r)), constant_values=np.nan) for r in rows]  # noqa: E731
                                ).reshape(len(rows), width)
    return seeds, pad(rows_a), pad(rows_b)


def _row(record, test_set, kind, method, reference, group_column, group, region, statistic, seeds, d) -> dict:
    low, high = t_interval(d)
    up, down, zero = sign_count(d)
    return dict(record=record, test_set=test_set, kind=kind, arm=method, reference=reference,
                group_column=group_column, group=group, region=region, metric="dice", statistic=statistic,
                n_seeds=len(seeds), seeds=";".join(map(str, seeds)), per_seed=";".join(f"{v:.4f}" for v in d),
                mean_over_seeds=float(np.nanmean(d)) if len(d) else np.nan, t95_low=low, t95_high=high,
                positive_seeds=up, negative_seeds=down, zero_seeds=zero,
                signs=f"+ on {up} of {up + down + zero} seeds")


def intervals(per_case: pd.DataFrame, record: str, test_set: str) -> list[dict]:
    per_case = per_case[per_case["metric"] == "dice"]
    group_columns = [c for c in per_case.columns if c not in NOT_GROUPS]
    methods = list(dict.fromkeys(per_case["method"]))
    pairs = [("arm", m, REFERENCE) for m in methods if m not in (REFERENCE, "ERM_repeat") and REFERENCE in methods]
    if "ERM_repeat" in methods:  # like for like: every arm against the ERM rerun, trained under the same conditions
        pairs += [("arm against ERM_repeat", m, "ERM_repeat") for m in methods if m not in (REFERENCE, "ERM_repeat")]
    pairs += [("noise floor", rerun, first) for rerun, first in REPEATS.items() if rerun in methods and first in methods]
    rows = []
    groupings = [("all", "all", per_case)] + [(c, g, per_case[per_case[c] == g]) for c in group_columns
                                              for g in sorted(per_case[c].dropna().unique())]
    for group_column, group, frame in groupings:
        for region in dict.fromkeys(frame["region"]):
            by_region = frame[frame["region"] == region]
            for kind, method, reference in pairs:
                seeds, a, b = per_seed_matrices(by_region, method, reference)
                if not seeds:
                    continue
                differences = paired_differences(a, b, STATISTICS)
                for statistic in STATISTICS:
                    rows.append(_row(record, test_set, kind, method, reference, group_column, group, region,
                                     statistic, seeds, differences[statistic]))
    return rows


def add_floor(table: pd.DataFrame) -> pd.DataFrame:
    """Beside every row, the ERM-vs-ERM floor of the same record, test set, group, region, statistic."""
    keys = ["record", "test_set", "group_column", "group", "region", "statistic"]
    floor = table[(table["kind"] == "noise floor") & (table["arm"] == "ERM_repeat")][
        keys + ["n_seeds", "per_seed", "mean_over_seeds"]].rename(
        columns={"n_seeds": "floor_erm_n_seeds", "per_seed": "floor_erm_per_seed",
                 "mean_over_seeds": "floor_erm_mean"})
    table = table.merge(floor, on=keys, how="left")
    table["floor_erm_mean_abs"] = table["floor_erm_per_seed"].map(
        lambda text: float(np.mean(np.abs([float(v) for v in text.split(";")]))) if isinstance(text, str) else np.nan)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", default=str(RECORD / "seed_intervals.csv"), help="output CSV")
    parser.add_argument("--print", nargs="*", default=["other,intra_axial_csf,p10", "spina_bifida,cerebellum,p10"],
                        metavar="GROUP,REGION,STATISTIC", help="rows to print (the record's main questions)")
    args = parser.parse_args()
    rows = []
    for folder in sorted(p for p in RECORD.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("per_case*.csv")):
            frame = pd.read_csv(path)
            if "seed" not in frame:
                continue
            test_set = "large_test" if "large_test" in path.name else "test"
            rows += intervals(frame, folder.name, test_set)
    table = add_floor(pd.DataFrame(rows))
    write_text_atomic(args.o, table.to_csv(index=False, float_format="%.4f"))
    shown = ["record", "test_set", "kind", "arm", "group", "region", "statistic", "n_seeds", "mean_over_seeds",
             "t95_low", "t95_high", "signs", "floor_erm_mean", "floor_erm_mean_abs"]
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_columns", 20):
        for spec in args.print:
            group, region, statistic = spec.split(",")
            print(table.query("group == @group and region == @region and statistic == @statistic")[shown]
                  .round(2).to_string(index=False))
        controls = table.query("group == 'control' and statistic == 'mean'")[shown]
        print(controls.round(2).to_string(index=False))
    print(f"{len(table)} rows written to {args.o}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
