"""Timing one training step and one epoch's end of nnU-Net trainers in one process, shared by
``scripts/benchmark_overhead.py`` (CPU) and ``scripts/gpu_check.py`` (GPU): trainers built on the
same preprocessed dataset from the same initial weights, their steps timed in turn."""
from __future__ import annotations

import statistics
import time


def build_trainer(cls, dataset_id: int, device: str = "cpu"):
    """``cls`` on fold 0 of the dataset, initialised with its loaders, in training mode; the same
    initial weights for every trainer (``scripts/benchmark_overhead.py`` and ``scripts/gpu_check.py`` build their trainers here)."""
    import torch
    from batchgenerators.utilities.file_and_folder_operations import join, load_json
    from nnunetv2.paths import nnUNet_preprocessed
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    folder = join(nnUNet_preprocessed, maybe_convert_to_dataset_name(dataset_id))
    plans = load_json(join(folder, "nnUNetPlans.json"))
    plans["continue_training"] = False
    torch.manual_seed(0)  # same initial weights for both trainers
    trainer = cls(plans, "3d_fullres", 0, load_json(join(folder, "dataset.json")), device=torch.device(device))
    trainer.initialize()
    trainer.dataloader_train, trainer.dataloader_val = trainer.get_dataloaders()
    weighting = getattr(trainer, "case_weighting", None)
    if getattr(weighting, "held_uniform", False):
        # the default's ERM phase would last the whole timing run: time the robust phase after it,
        # the phase that adds work (draws from p, the beta solve of every update)
        weighting.release()
    trainer.network.train()
    trainer.on_train_epoch_start()
    return trainer


def interleaved_step_times(trainers: dict, warmup: int, n: int, sync=lambda: None,
                           clock=time.perf_counter) -> dict[str, list[float]]:
    """Seconds of ``train_step`` per trainer, the trainers stepped in turn (the order alternating
    every iteration, so load drifts hit all alike), batches fetched outside the timed region,
    ``sync()`` (e.g. ``torch.cuda.synchronize``) around each step; the first ``warmup`` iterations
    are not kept. ``clock``: wall time by default; ``time.process_time`` counts this process's CPU
    seconds only (with one torch thread and no augmentation workers, the step's own work, much less
    disturbed by other load on a shared machine)."""
    times = {name: [] for name in trainers}
    order = list(trainers)
    for it in range(warmup + n):
        for name in (order if it % 2 == 0 else order[::-1]):
            trainer = trainers[name]
            batch = next(trainer.dataloader_train)
            sync()
            start = clock()
            trainer.train_step(batch)
            sync()
            if it >= warmup:
                times[name].append(clock() - start)
    return times


def time_epoch_additions(dro, repeats: int = 5) -> tuple[float, float, float]:
    """Median seconds a DRO trainer adds at an epoch's end: the epoch statistics and their log
    lines, the csv alone (the png not due) and the csv with a png drawing (forced)."""
    stats_times, csv_times, both_times = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        dro._record_and_log_dro_statistics()
        stats_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        dro.write_hardness_report(redraw_now=True)
        both_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        dro.write_hardness_report(redraw_now=False)  # right after a drawing: the png is not due
        csv_times.append(time.perf_counter() - start)
    return statistics.median(stats_times), statistics.median(csv_times), statistics.median(both_times)
