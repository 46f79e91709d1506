"""scripts/seed_intervals.py: the record's per-seed differences against the record's own paired.csv
(computed by the benchmark's analysis, another code path), and the t-interval over seeds."""
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "data_docs" / "benchmark_record" / "alternatives177_240"


def _script():
    spec = importlib.util.spec_from_file_location("seed_intervals", REPO / "scripts" / "seed_intervals.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mean_over_seeds_equals_the_records_paired_differences_and_t_interval():
    per_case = pd.read_csv(RECORD / "per_case.csv")
    per_case = per_case[per_case["region"] == "intra_axial_csf"]
    table = pd.DataFrame(_script().intervals(per_case, RECORD.name, "test"))
    paired = pd.read_csv(RECORD / "paired.csv").query("region == 'intra_axial_csf'")
    compared = 0
    for _, record in paired.iterrows():
        for statistic in ("mean", "p10", "p5"):
            row = table.query("arm == @record.method and reference == 'ERM' and group == @record.group and "
                              "statistic == @statistic")
            if len(row) != 1:
                continue
            row = row.iloc[0]
            assert row["mean_over_seeds"] == pytest.approx(record[f"d_{statistic}"], abs=1e-9)
            assert row["n_seeds"] == record["n_seeds"]
            d = np.array([float(v) for v in row["per_seed"].split(";")])
            if d.size > 1:
                half = scipy_stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
                assert row["t95_low"] == pytest.approx(d.mean() - half, abs=1e-3)
            compared += 1
    assert compared >= 3 * 3 * 7  # groups x statistics x arms against ERM
    floor = table.query("kind == 'noise floor' and arm == 'ERM_repeat' and group == 'other' and statistic == 'p10'")
    assert floor["seeds"].iloc[0] == "13;15"
