"""Benchmark: ``nnunet_dro evaluate`` against nnU-Net's ``nnUNetv2_evaluate_folder`` on the same folder.

Writes a seeded synthetic cohort of NIfTI label maps (nested ellipsoids from
:mod:`nnunet_dro.data.synthetic_shapes`; default 40 cases of 96^3 with 3 labels,
plus one prediction per case), then runs, in the same session and with the same number of
processes, both command-line tools end to end (start-up, reading, metrics, writing) and prints
both wall-clock times, the ratio (ours / nnU-Net; target <= 1.0) and the largest per-case Dice
difference (identical Dice expected: differences at float rounding, < 1e-9 percent).

A third command, ``nnunet_dro evaluate --metrics dice nsd topology`` (normalised surface Dice
and the four topology errors on every label), is timed in the same rounds; its ratio to nnU-Net
has the target <= 1.5 (``--no-surface`` leaves it out).

    .venv/bin/python scripts/benchmark_evaluation.py            # 40 cases, 96^3, -np 2
    .venv/bin/python scripts/benchmark_evaluation.py --cases 10 --size 64 --np 1

Each tool runs ``--repeats`` times, alternating, and the best time of each is kept (the files
stay in the page cache after the first read either way).
"""
from __future__ import annotations

import argparse
import json
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

from nnunet_dro.data.synthetic_shapes import imperfect_prediction, nested_ellipsoids

BIN = Path(sys.executable).parent


def write(array: np.ndarray, path: Path, spacing) -> None:
    image = sitk.GetImageFromArray(array)
    image.SetSpacing(spacing)
    sitk.WriteImage(image, str(path), True)


def make_cohort(root: Path, cases: int, size: int, labels: int, seed: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    ref, pred = root / "labelsTs", root / "predictions"
    ref.mkdir(parents=True)
    pred.mkdir()
    for i in range(cases):
        truth = nested_ellipsoids(rng, size, labels)
        spacing = (0.8, 0.8, 1.5)
        write(truth, ref / f"case_{i:03d}.nii.gz", spacing)
        write(imperfect_prediction(rng, truth, labels), pred / f"case_{i:03d}.nii.gz", spacing)
    (root / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "MRI"}, "labels": {"background": 0, **{f"label{k}": k for k in range(1, labels + 1)}},
        "numTraining": cases, "file_ending": ".nii.gz"}))
    (root / "plans.json").write_text(json.dumps({"label_manager": "LabelManager"}))
    return ref, pred


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return elapsed


def per_case_work(ref: Path, pred: Path, labels: int, **mask_metrics) -> tuple[float, float]:
    """Both tools' per-case functions in this process: reading and scoring without pool start-up."""
    from nnunetv2.evaluation.evaluate_predictions import compute_metrics
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO

    from nnunet_dro.evaluation.metrics import CaseTask, evaluate_case

    cases = sorted(p.name for p in ref.iterdir())
    start = time.perf_counter()
    for name in cases:
        compute_metrics(str(ref / name), str(pred / name), SimpleITKIO(), list(range(1, labels + 1)))
    theirs = time.perf_counter() - start
    start = time.perf_counter()
    for name in cases:
        evaluate_case(CaseTask(case=name, reference=str(ref / name), predictions=(("bench", str(pred / name)),),
                               **mask_metrics))
    return theirs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--labels", type=int, default=3)
    parser.add_argument("--np", type=int, default=2, help="processes for both tools (default 2)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-surface", action="store_true", help="do not time the run with NSD and topology")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="nnunet_dro_bench_eval_"))
    try:
        t = time.perf_counter()
        ref, pred = make_cohort(root, args.cases, args.size, args.labels, args.seed)
        print(f"cohort: {args.cases} cases of {args.size}^3, {args.labels} labels, written in "
              f"{time.perf_counter() - t:.1f} s to {root}")
        env = dict(os.environ, OMP_NUM_THREADS="1", nnUNet_def_n_proc=str(args.np))
        nnunet = [str(BIN / "nnUNetv2_evaluate_folder"), str(ref), str(pred), "-djfile", str(root / "dataset.json"),
                  "-pfile", str(root / "plans.json"), "-o", str(root / "nnunet_summary.json"), "-np", str(args.np)]
        ours = [str(BIN / "nnunet_dro"), "evaluate", "-ref", str(ref), "-pred", f"bench={pred}",
                "-o", str(root / "report"), "-np", str(args.np)]
        surface = [str(BIN / "nnunet_dro"), "evaluate", "-ref", str(ref), "-pred", f"bench={pred}",
                   "-o", str(root / "report_surface"), "-np", str(args.np), "--metrics", "dice", "nsd", "topology"]
        times = {"nnUNetv2_evaluate_folder": [], "nnunet_dro evaluate": []}
        if not args.no_surface:
            times["nnunet_dro evaluate +nsd +topology"] = []
        for _ in range(args.repeats):
            times["nnUNetv2_evaluate_folder"].append(timed(nnunet, env))
            times["nnunet_dro evaluate"].append(timed(ours, env))
            if not args.no_surface:
                times["nnunet_dro evaluate +nsd +topology"].append(timed(surface, env))
        theirs_s, ours_s = min(times["nnUNetv2_evaluate_folder"]), min(times["nnunet_dro evaluate"])

        summary = json.loads((root / "nnunet_summary.json").read_text())
        expected = {(Path(e["reference_file"]).name[: -len(".nii.gz")], str(k)): 100 * m["Dice"]
                    for e in summary["metric_per_case"] for k, m in e["metrics"].items()}
        per_case = pd.read_csv(root / "report" / "per_case.csv")
        # regions are named as in the dataset.json beside labelsTs (label1, ...); nnU-Net names them by value
        got = {(r.case, str(r.region).removeprefix("label")): r.value for r in per_case.itertuples()
               if r.metric == "dice"}
        assert expected.keys() == got.keys(), "the two tools scored different cases or labels"
        difference = max(abs(expected[k] - got[k]) for k in expected)

        print(f"processes: {args.np}, best of {args.repeats} runs each (wall clock, whole command)")
        for name, values in times.items():
            print(f"  {name:36s} {min(values):7.2f} s   (runs: {', '.join(f'{v:.2f}' for v in values)})")
        print(f"ratio nnunet_dro / nnU-Net: {ours_s / theirs_s:.2f}  (target <= 1.0)")
        if not args.no_surface:
            surface_s = min(times["nnunet_dro evaluate +nsd +topology"])
            print(f"ratio nnunet_dro with dice, nsd, topology / nnU-Net: {surface_s / theirs_s:.2f}  (target <= 1.5)")
        theirs_core, ours_core = per_case_work(ref, pred, args.labels)
        print(f"per-case work only, one process, no start-up (read + all labels, summed over cases):\n"
              f"  nnU-Net compute_metrics     {theirs_core:7.2f} s\n  nnunet_dro evaluate_case    {ours_core:7.2f} s\n"
              f"  ratio {ours_core / theirs_core:.2f}")
        if not args.no_surface:
            _, surface_core = per_case_work(ref, pred, args.labels, compute_nsd=True, compute_topology=True)
            print(f"  nnunet_dro evaluate_case with nsd and topology {surface_core:7.2f} s, ratio to nnU-Net's "
                  f"compute_metrics (Dice only) {surface_core / theirs_core:.2f}")
        print(f"Dice: {len(expected)} case-label values, max |difference| = {difference:.2e} percent "
              f"({'identical' if difference < 1e-9 else 'DIFFERENT'})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
