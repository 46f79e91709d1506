"""scripts/benchmark_overhead.py runs end to end (real nnU-Net planning and trainers, a couple of
iterations) and prints every figure docs/evidence.md quotes: the per-iteration ratio, the loss-only
cost, the end-of-epoch additions with their per-epoch ratio, and the beta solve."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_overhead.py"


@pytest.mark.slow
def test_overhead_benchmark_prints_iteration_and_epoch_ratios(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("nnUNet_")}
    out = subprocess.run([sys.executable, str(SCRIPT), "-n", "2", "--warmup", "0", "--trainers",
                          "nnUNetTrainerDROAdaptive"], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    ratio = re.search(r"ratio nnUNetTrainerDROAdaptive/ERM \(median iteration time\): ([\d.]+)", text)
    assert ratio and float(ratio.group(1)) > 0
    epoch = re.search(r"end of epoch: statistics \+ log ([\d.]+) ms, dro_hardness\.csv ([\d.]+) ms, "
                      r"dro_progress\.png (\d+) ms a drawing -> (\d+) ms per epoch at 0\.01 of the wall time; "
                      r"per epoch of 250 iterations: the additions alone ([\d.]+) x ERM", text)
    assert epoch, text[-3000:]
    png, png_per_epoch, additions = float(epoch.group(3)), float(epoch.group(4)), float(epoch.group(5))
    assert 0 < png_per_epoch <= png and 1.0 < additions < 1.02
    assert re.search(r"n =  100000: +[\d.]+ ms per solve", text)
    assert list(tmp_path.iterdir()) == []  # the synthetic dataset went to a temporary folder, now removed
