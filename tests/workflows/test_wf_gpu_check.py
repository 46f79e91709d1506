"""scripts/gpu_check.py at its CPU size (``--device cpu --quick``), so the GPU check cannot rot:
every step through nnU-Net's real commands, the table printed and the JSON written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def test_gpu_check_quick_on_cpu(tmp_path):
    out = tmp_path / "check"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "-o", str(out),
                           "--time-limit", "600"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    names = [s["name"] for s in report["steps"]]
    assert names == ["environment", "cohort", "train nnUNetTrainer", "train nnUNetTrainerDROAdaptive",
                     "kill and resume", "iteration time", "predict", "export", "evaluate"]
    assert report["ok"] and all(s["ok"] for s in report["steps"])
    assert set(report["timing"]["ratios"]) == {"nnUNetTrainerDRO", "nnUNetTrainerDROAdaptive",
                                               "nnUNetTrainerGroupBalanced"}
    for entry in report["timing"]["ratios"].values():
        assert entry["median_paired_ratio"] > 0
    assert "all steps ok" in proc.stdout and "iteration time nnUNetTrainerDROAdaptive/nnUNetTrainer" in proc.stdout
    assert (out / "report" / "table.md").is_file()


def test_gpu_check_refuses_a_used_output_folder(tmp_path):
    (tmp_path / "something").write_text("x")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not empty" in proc.stderr
