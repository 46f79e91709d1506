"""A small cohort for the discovery tests: a synthetic fetal test set (``make-synthetic``) and
predictions made from its references, mildly perturbed for every case and badly degraded for a
planted subgroup (stated: these are not a network's predictions; the test checks that the planted
group is recovered)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import SimpleITK as sitk
from scipy import ndimage

REPO = Path(__file__).resolve().parents[2]
NNUNET_DRO = [sys.executable, "-m", "nnunet_dro"]


def run_cli(args, env=None, check=True) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    result = subprocess.run(NNUNET_DRO + [str(a) for a in args], capture_output=True, text=True, env=environment)
    if check and result.returncode != 0:
        raise AssertionError(f"nnunet_dro {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr}")
    return result


def make_cohort(root: Path, n_test: int = 60, seed: int = 3) -> Path:
    """``make-synthetic --kind fetal`` under ``root/raw``; returns the dataset folder."""
    run_cli(["make-synthetic", "--kind", "fetal", "--id", 901, "-n", "Disc", "--n-train", 4, "--n-test", n_test,
             "--size", 32, "--seed", seed, "--overwrite"], env={"nnUNet_raw": str(root / "raw")})
    return root / "raw" / "Dataset901_Disc"


def degrade(label: np.ndarray, planted: bool, rng: np.random.Generator) -> np.ndarray:
    """Every case: 3 % of the boundary voxels of each structure flipped to background. Planted
    cases also lose their cerebellum (5) to the ventricles' label (4) outside its eroded core."""
    out = label.copy()
    boundary = (label > 0) & ~ndimage.binary_erosion(label > 0)
    out[boundary & (rng.random(label.shape) < 0.03)] = 0
    if planted:
        cerebellum = label == 5
        out[cerebellum & ~ndimage.binary_erosion(cerebellum, iterations=1)] = 4
    return out


def make_predictions(dataset: Path, out: Path, planted: set[str], seed: int = 0) -> Path:
    """One prediction per ``labelsTs`` file in ``out`` (geometry copied from the reference)."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted((dataset / "labelsTs").glob("*.nii.gz")):
        case = path.name[:-len(".nii.gz")]
        image = sitk.ReadImage(str(path))
        prediction = sitk.GetImageFromArray(degrade(sitk.GetArrayFromImage(image), case in planted, rng))
        prediction.CopyInformation(image)
        sitk.WriteImage(prediction, str(out / path.name), True)
    return out
