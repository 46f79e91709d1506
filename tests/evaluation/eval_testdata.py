"""Tiny synthetic label maps for the evaluation tests (written as real NIfTI files)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import SimpleITK as sitk

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"


def write_label_map(path, array, spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0), direction=None) -> Path:
    """Write ``array`` (numpy z, y, x order) as a label map; spacing/origin in SimpleITK x, y, z order."""
    image = sitk.GetImageFromArray(np.asarray(array))
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    if direction is not None:
        image.SetDirection(direction)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(image, str(path), True)
    return path


def random_label_map(rng: np.random.Generator, shape=(16, 16, 16), labels=(1, 2, 3)) -> np.ndarray:
    """Blobby label map: a few random boxes per label on background."""
    array = np.zeros(shape, np.uint8)
    for label in labels:
        for _ in range(2):
            lo = rng.integers(0, np.array(shape) - 4)
            size = rng.integers(3, 8, size=3)
            array[tuple(slice(int(a), int(a + s)) for a, s in zip(lo, size))] = label
    return array


def perturb(rng: np.random.Generator, array: np.ndarray, fraction: float = 0.1, labels=(0, 1, 2, 3)) -> np.ndarray:
    """A 'prediction': shift the map by one voxel and flip a fraction of voxels to random labels."""
    out = np.roll(array, int(rng.integers(-1, 2)), axis=int(rng.integers(0, 3))).copy()
    flip = rng.random(array.shape) < fraction
    out[flip] = rng.choice(np.asarray(labels, np.uint8), size=int(flip.sum()))
    return out


def make_cohort(root, n_cases=6, methods=("A", "B"), seed=0, shape=(16, 16, 16), labels=(1, 2, 3),
                fractions=None, spacing=(1.0, 1.0, 2.0)) -> tuple[Path, dict[str, Path]]:
    """Reference folder and one prediction folder per method under ``root``."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    ref = root / "ref"
    preds = {m: root / f"pred_{m}" for m in methods}
    fractions = fractions or {m: 0.05 * (i + 1) for i, m in enumerate(methods)}
    for i in range(n_cases):
        truth = random_label_map(rng, shape, labels)
        write_label_map(ref / f"case_{i:03d}.nii.gz", truth, spacing=spacing)
        for m in methods:
            write_label_map(preds[m] / f"case_{i:03d}.nii.gz",
                            perturb(rng, truth, fractions[m], (0,) + tuple(labels)), spacing=spacing)
    return ref, preds


def run_cli(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """Run ``python -m nnunet_dro evaluate ARGS`` in a subprocess (the real CLI)."""
    env = dict(os.environ, nnUNet_def_n_proc="2", OMP_NUM_THREADS="1")
    return subprocess.run([str(PYTHON if PYTHON.exists() else sys.executable), "-m", "nnunet_dro", "evaluate",
                           *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
