"""Overhead of the DRO trainers over nnU-Net's nnUNetTrainer per training iteration (CPU).

Both trainers are built on the same preprocessed dataset in one process; their training steps
are timed alternately (which one goes first alternates too), so machine load affects both
alike. Timed: ``train_step(batch)`` (forward, loss, backward, optimiser step, and for DRO the
per-sample loss, importance weights and sampler update). Batches come from each trainer's own
loader in the main process (``nnUNet_n_proc_DA=0``) and are fetched outside the timed region;
the sampler draw that DRO adds to the loader is timed separately, and so is what a DRO trainer
adds at the end of each epoch (statistics and log lines, ``dro_hardness.csv``, the paced
``dro_progress.png``), turned into a per-epoch ratio for nnU-Net's epoch of 250 iterations.

    python scripts/benchmark_overhead.py                 # synthetic 8 cases of 32^3, preprocessed in a tmp folder
    python scripts/benchmark_overhead.py -d 4 -n 40      # an existing dataset under $nnUNet_preprocessed
    python scripts/benchmark_overhead.py --trainers nnUNetTrainerDROReweight,nnUNetTrainerL2RW -n 10
    python scripts/benchmark_overhead.py --trainers nnUNetTrainerDROLS,nnUNetTrainerDROLS_T1,nnUNetTrainerDROLS_DRO -n 8

Prints the median iteration time of each trainer and its ratio to ERM (target <= 1.02; <= 1.15 for
the GI-LS trainers, whose ascent re-runs the segmentation heads T times, T printed). Every
listed trainer (``--trainers``, any class exported by ``nnunet_dro.training``; default
nnUNetTrainerDRO and nnUNetTrainerDROAdaptive) is timed against nnUNetTrainer in the same
interleaved loop. For trainers that weight cases it also prints the cost of the part they change
on one identical network output, and the draw time. Last, the cost of the scale-free beta solve
(perplexity root finder) for n = 1e2 .. 1e5 cases, alone and amortised over the updates between
two solves (``adapt_every = max(1, n // 256)``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nnunet_dro.lab.timing import build_trainer, interleaved_step_times, time_epoch_additions


def make_synthetic_dataset(root: Path, dataset_id: int, num_cases: int, size: int) -> None:
    """The package's synthetic fetal cohort (``nnunet_dro make-synthetic --kind fetal``: the one
    generator of data, benchmarks and tests), ``num_cases`` training cases of ``size^3`` under
    ``root/raw``, planned and preprocessed for 3d_fullres."""
    from nnunet_dro.data.raw_dataset import DatasetTarget
    from nnunet_dro.data.synthetic_common import CohortSpec
    from nnunet_dro.data.synthetic_fetal import make_fetal_dataset

    make_fetal_dataset(DatasetTarget(dataset_id, "DROBenchmark"), CohortSpec(n_train=num_cases, n_test=0, size=size))
    subprocess.run([str(Path(sys.executable).parent / "nnUNetv2_plan_and_preprocess"), "-d", str(dataset_id),
                    "-c", "3d_fullres", "-np", "2", "-npfp", "2"], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "nnUNet_n_proc_DA": "2"})  # planning crashes with 0


def time_loss_only(erm, dro, repeats: int):
    """Time the part of the step a case-weighting trainer changes, on one identical network output:
    nnU-Net's loss and backward vs. the per-sample loss, weights, weighted mean, backward, update."""
    import torch

    batch = next(dro.dataloader_train)
    indices = dro._batch_indices(batch["keys"])
    draw_beta = np.asarray(batch.get("dro_beta", np.full(indices.size, np.nan)), dtype=np.float64)
    with torch.no_grad():
        output = [o.detach() for o in dro.network(batch["data"])]
    target = batch["target"]
    erm_times, dro_times = [], []
    for _ in range(repeats):
        out = [o.clone().requires_grad_(True) for o in output]
        start = time.perf_counter()
        erm.loss(out, target).backward()
        erm_times.append(time.perf_counter() - start)

        out = [o.clone().requires_grad_(True) for o in output]
        start = time.perf_counter()
        per_sample = dro.per_sample_loss(out, target)
        fresh = per_sample.detach().float().cpu().numpy().astype(np.float64)
        weights = dro.case_weighting.weights(indices, fresh, draw_beta)
        (torch.from_numpy(weights.astype(np.float32)) * per_sample).mean().backward()
        dro.case_weighting.update(indices, fresh, draw_beta)
        dro_times.append(time.perf_counter() - start)
    return erm_times, dro_times


def time_beta_solve(sizes=(100, 1_000, 10_000, 100_000), fraction: float = 0.5) -> None:
    """Cost of one scale-free beta solve and its amortised cost per update."""
    from nnunet_dro.sampling.temperature import solve_beta_for_perplexity

    rng = np.random.default_rng(0)
    print(f"scale-free beta (perplexity >= {fraction:g} n), one solve on realistic losses (0.05-0.6):")
    for n in sizes:
        losses = rng.gamma(2.0, 0.1, n) + 0.05
        runs = []
        for _ in range(max(3, 2000 // n)):
            start = time.perf_counter()
            solve_beta_for_perplexity(losses, fraction, 100.0)
            runs.append(time.perf_counter() - start)
        every = max(1, n // 256)
        one = statistics.median(runs)
        print(f"  n = {n:>7}: {1e3 * one:8.3f} ms per solve; re-solved every {every:>4} updates -> "
              f"{1e3 * one / every:.3f} ms per update")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-d", type=int, default=None,
                        help="preprocessed dataset ID under $nnUNet_preprocessed (default: a synthetic one)")
    parser.add_argument("-n", type=int, default=30, help="timed iterations per trainer (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations per trainer first (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--trainers", default="nnUNetTrainerDRO,nnUNetTrainerDROAdaptive",
                        help="comma-separated trainer classes of nnunet_dro.training to time against "
                             "nnUNetTrainer (default nnUNetTrainerDRO,nnUNetTrainerDROAdaptive)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time the steps by wall time (default) or by this process's CPU time (steadier on a "
                             "loaded machine; with --threads 1)")
    args = parser.parse_args(argv)

    os.environ["nnUNet_n_proc_DA"] = "0"
    os.environ.setdefault("nnUNet_compile", "f")
    os.environ.setdefault("nnUNet_def_n_proc", "2")
    tmp = None
    dataset_id = args.d
    if dataset_id is None:
        tmp = tempfile.TemporaryDirectory(prefix="dro_benchmark_")
        root = Path(tmp.name)
        for key, sub in (("nnUNet_raw", "raw"), ("nnUNet_preprocessed", "preprocessed"), ("nnUNet_results", "results")):
            os.environ[key] = str(root / sub)
            (root / sub).mkdir(parents=True, exist_ok=True)
        dataset_id = 990
        print("preprocessing a synthetic dataset (8 cases of 32^3) ...", flush=True)
        make_synthetic_dataset(root, dataset_id, num_cases=8, size=32)
    elif "nnUNet_results" not in os.environ:
        os.environ["nnUNet_results"] = tempfile.mkdtemp(prefix="dro_benchmark_results_")

    import torch
    torch.set_num_threads(args.threads)
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    from nnunet_dro.lab.variants import LAB_VARIANTS
    from nnunet_dro.training.registry import BASES, TRAINERS

    known = {name: cls for name, cls in {**TRAINERS, **LAB_VARIANTS}.items() if name not in BASES}  # the product's and the lab's
    names = [n.strip() for n in args.trainers.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--trainers: unknown trainer(s) {unknown or args.trainers!r}; choose from {sorted(known)}")
    trainers = {"ERM nnUNetTrainer": build_trainer(nnUNetTrainer, dataset_id)}
    for name in names:
        trainers[name] = build_trainer(known[name], dataset_id)
    times = interleaved_step_times(trainers, args.warmup, args.n,
                                   clock=time.process_time if args.clock == "cpu" else time.perf_counter)
    erm = trainers["ERM nnUNetTrainer"]
    patch = erm.configuration_manager.patch_size
    num_cases = len(erm.get_tr_and_val_datasets()[0].identifiers)
    print(f"dataset {dataset_id}, patch {patch}, batch {erm.batch_size}, {num_cases} training "
          f"cases, {args.n} timed iterations each (interleaved), torch threads {args.threads}, "
          f"{'CPU' if args.clock == 'cpu' else 'wall'} time")
    medians = {}
    for name, values in times.items():
        q1, q3 = np.percentile(values, [25, 75])
        medians[name] = statistics.median(values)
        print(f"  {name:22s} median {medians[name]:.4f} s/iteration  (IQR {q1:.4f}-{q3:.4f})")
    erm = medians["ERM nnUNetTrainer"]
    for name in names:
        paired = np.array(times[name]) / np.array(times["ERM nnUNetTrainer"])
        print(f"  ratio {name}/ERM (median iteration time): {medians[name] / erm:.4f}, median of paired ratios "
              f"(robust to load drift) {np.median(paired):.4f}  ({target_text(trainers[name])})")
        if hasattr(trainers[name], "case_weighting"):
            print_case_weighting_figures(name, trainers, args.n, medians)
    time_beta_solve()
    for trainer in trainers.values():
        if hasattr(trainer, "_close_case_weighting"):
            trainer._close_case_weighting()
    if tmp is not None:
        tmp.cleanup()
    return 0


def target_text(trainer) -> str:
    """The cost target of a trainer: 1.02 x ERM, 1.15 x for GI-LS (its T ascent steps named)."""
    settings = getattr(trainer, "gils_settings", None)
    steps = None if settings is None else settings.steps
    return "target <= 1.02" if steps is None else f"GI-LS with T = {steps} ascent steps: target <= 1.15"


def print_case_weighting_figures(name, trainers, n, medians) -> None:
    """Loss-only cost and draw time of a case-weighting trainer, its end-of-epoch additions and the
    per-epoch ratio they give with the iteration ``medians``."""
    erm = trainers["ERM nnUNetTrainer"]
    dro = trainers[name]
    erm_loss, dro_loss = (statistics.median(v) for v in time_loss_only(erm, dro, n))
    draws = []
    for _ in range(2000):
        start = time.perf_counter()
        dro.case_weighting.sample_with_beta(dro.batch_size)
        draws.append(time.perf_counter() - start)
    print(f"    loss only, same network output: nnU-Net loss {1e3 * erm_loss:.2f} ms, per-sample loss + weights + "
          f"update {1e3 * dro_loss:.2f} ms; draw of one batch (in the DA workers) "
          f"{1e6 * statistics.median(draws):.1f} us")
    print_epoch_figures(dro, medians[name], medians["ERM nnUNetTrainer"])


def print_epoch_figures(dro, dro_iteration: float, erm_iteration: float, iterations: int = 250) -> None:
    """The end-of-epoch additions and the per-epoch ratio they give with nnU-Net's 250 iterations:
    the png costs at most ``dro_progress_time_fraction`` of the wall time (its pacer), so per epoch
    the smaller of one drawing and that fraction of the epoch."""
    stats_cost, csv_cost, with_png = time_epoch_additions(dro)
    png_cost = max(0.0, with_png - csv_cost)
    epoch = iterations * dro_iteration
    png_per_epoch = min(png_cost, dro.dro_progress_time_fraction * epoch)
    additions = stats_cost + csv_cost + png_per_epoch
    erm_epoch = iterations * erm_iteration
    print(f"    end of epoch: statistics + log {1e3 * stats_cost:.1f} ms, dro_hardness.csv {1e3 * csv_cost:.1f} ms, "
          f"dro_progress.png {1e3 * png_cost:.0f} ms a drawing -> {1e3 * png_per_epoch:.0f} ms per epoch at "
          f"{dro.dro_progress_time_fraction:g} of the wall time; per epoch of {iterations} iterations: the "
          f"additions alone {1 + additions / erm_epoch:.4f} x ERM, with these iteration medians "
          f"{(epoch + additions) / erm_epoch:.4f} x ERM")


if __name__ == "__main__":
    raise SystemExit(main())
