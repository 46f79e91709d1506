"""Benchmark: what the gallery of worst cases (``worst_<metric>.png``) adds to ``nnunet_dro evaluate``.

Writes the synthetic fetal cohort (``nnunet_dro make-synthetic``'s, images and subgroups.tsv
included) to a temporary ``nnUNet_raw`` and one imperfect prediction per test case (shifted by up
to 2 voxels, 4 for the ``other`` condition, and 0.2 % of the voxels flipped; a stand-in for a
network, drawn with a seed), then times the whole command ``nnunet_dro evaluate -groups
subgroups.tsv --group-by condition`` with ``--gallery 0`` and with the default ``--gallery 4``
(images found beside labelsTs), alternating, best of ``--repeats`` each, and prints the ratio.

    .venv/bin/python scripts/benchmark_gallery.py                      # 40 cases of 64^3, -np 2
    .venv/bin/python scripts/benchmark_gallery.py --figure docs/figures/worst_dice_synthetic.png

``--figure PATH`` writes the gallery shown in docs/evaluation.md instead (12 cases of 48^3, two
regions, three cases each: small enough to commit) and times nothing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import SimpleITK as sitk

from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.synthetic_common import CohortSpec
from nnunet_dro.data.synthetic_fetal import make_fetal_dataset
from nnunet_dro.data.synthetic_shapes import imperfect_prediction

BIN = Path(sys.executable).parent


def make_inputs(root: Path, cases: int, size: int, seed: int) -> tuple[Path, Path, Path]:
    """(labelsTs, prediction folder, subgroups.tsv) of a fresh synthetic fetal cohort under ``root``."""
    os.environ["nnUNet_raw"] = str(root / "raw")
    dataset = make_fetal_dataset(DatasetTarget(999, "SyntheticFetal"), CohortSpec(n_train=1, n_test=cases, size=size, seed=seed))
    groups = pd.read_csv(dataset / "subgroups.tsv", sep="\t").set_index("case")["condition"]
    rng = np.random.default_rng(seed)
    prediction_folder = root / "prediction"
    prediction_folder.mkdir()
    labels = dataset / "labelsTs"
    for path in sorted(labels.iterdir()):
        image = sitk.ReadImage(str(path))
        truth = sitk.GetArrayFromImage(image)
        case = path.name[: -len(".nii.gz")]
        shift = 4 if groups[case] == "other" else 2
        prediction = imperfect_prediction(rng, truth, int(truth.max()), max_shift=shift, flip_fraction=0.002)
        out = sitk.GetImageFromArray(prediction.astype(np.uint8))
        out.CopyInformation(image)
        sitk.WriteImage(out, str(prediction_folder / path.name), True)
    return labels, prediction_folder, dataset / "subgroups.tsv"


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40, help="test cases (default 40)")
    parser.add_argument("--size", type=int, default=64, help="voxels per side (default 64)")
    parser.add_argument("--np", type=int, default=2, help="processes reading cases (default 2)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", type=Path, default=None, metavar="PATH",
                        help="write the documentation's example gallery to PATH and time nothing")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="nnunet_dro_bench_gallery_"))
    try:
        cases, size = (12, 48) if args.figure else (args.cases, args.size)
        t = time.perf_counter()
        labels, prediction, groups = make_inputs(root, cases, size, args.seed)
        print(f"cohort: {cases} test cases of {size}^3 with images, written in {time.perf_counter() - t:.1f} s")
        env = dict(os.environ, OMP_NUM_THREADS="1", nnUNet_def_n_proc=str(args.np))
        command = [str(BIN / "nnunet_dro"), "evaluate", "-ref", str(labels), "-pred", f"network={prediction}",
                   "-groups", str(groups), "--group-by", "condition", "-np", str(args.np)]
        if args.figure:
            timed(command + ["-o", str(root / "report"), "--gallery", "3", "-regions",
                             "ventricles=4;cerebellum=5"], env)
            args.figure.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / "report" / "worst_dice.png", args.figure)
            print(f"wrote {args.figure} ({args.figure.stat().st_size / 1024:.0f} KB)")
            return
        times: dict[str, list[float]] = {"--gallery 0": [], "--gallery 4": []}
        for _ in range(args.repeats):
            times["--gallery 0"].append(timed(command + ["-o", str(root / "off"), "--gallery", "0"], env))
            times["--gallery 4"].append(timed(command + ["-o", str(root / "on"), "--gallery", "4"], env))
        off, on = min(times["--gallery 0"]), min(times["--gallery 4"])
        print(f"processes: {args.np}, best of {args.repeats} runs each (wall clock, whole command)")
        for name, values in times.items():
            runs = ", ".join(f"{v:.2f}" for v in values)
            print(f"  nnunet_dro evaluate {name:12s} {min(values):7.2f} s   (runs: {runs})")
        print(f"ratio with gallery / without: {on / off:.2f}  (+{on - off:.2f} s)")
        sizes = {p.name: p.stat().st_size for p in sorted((root / "on").iterdir())}
        print(f"worst_dice.png {sizes['worst_dice.png'] / 1024:.0f} KB, "
              f"report.html {sizes['report.html'] / 1024:.0f} KB")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
