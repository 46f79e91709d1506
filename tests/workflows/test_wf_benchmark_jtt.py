"""The benchmark's JTT arm end to end through nnU-Net's real commands (test-sized): ERM trains, its
final network is scored on its own training cases, the worst fifth by their worst region's Dice
becomes the error set, and the second training (its own trainer folder) reads the table; the
record keeps the table."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from nnunet_dro.workflows.pipeline import JTT_SETTINGS

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_robustness.py"
N_TRAIN = 10


def test_jtt_arm_trains_twice_with_the_error_set_of_the_erm_network(tmp_path):
    out, record = tmp_path / "bench", tmp_path / "record"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "nnUNet_n_proc_DA": "0"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0,", "--arms", "ERM,JTT", "--epochs", "1",
                           "--iterations", "2", "--n-train", str(N_TRAIN), "--n-test", "3", "--size", "16",
                           "-o", str(out), "--export-record", str(record)],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seed = out / "runs" / "seed_0"

    # stage 1: the ERM network scored on its training cases; the error set is its worst fifth
    fit = pd.read_csv(seed / "arms" / "ERM" / "per_case_training.csv", dtype={"case": str})
    worst = fit.dropna(subset=["value"]).groupby("case")["value"].min()
    assert len(worst) == N_TRAIN
    table = pd.read_csv(seed / "arms" / "JTT" / "case_weights.tsv", sep="\t", dtype={"case": str})
    assert sorted(table["case"]) == sorted(worst.index)
    chosen = set(table.loc[table["weight"] == JTT_SETTINGS["upweight"], "case"])
    assert len(chosen) == math.ceil(JTT_SETTINGS["fraction"] * N_TRAIN)
    assert set(table["weight"]) == {1.0, JTT_SETTINGS["upweight"]}
    assert max(worst[c] for c in chosen) <= min(worst[c] for c in set(worst.index) - chosen)
    assert "error set of the ERM network on its training cases" in proc.stdout

    # stage 2: its own trainer and results folder, which read that table
    result = json.loads((seed / "arms" / "JTT" / "result.json").read_text())
    assert result["trainer"] == "nnUNetTrainerCaseWeights_CPUBudget_JTT"
    results = seed / "nnunet" / "nnUNet_results" / "Dataset991_SyntheticFetalBenchmark"
    log = next((results / "nnUNetTrainerCaseWeights_CPUBudget_JTT__nnUNetPlans__3d_fullres" / "fold_all")
               .glob("training_log_*.txt")).read_text()
    assert str(seed / "arms" / "JTT" / "case_weights.tsv") in log
    assert (record / "runs" / "seed_0" / "arms" / "JTT" / "case_weights.tsv").read_text() == \
        (seed / "arms" / "JTT" / "case_weights.tsv").read_text()
    assert "JTT" in (out / "summary.md").read_text()
