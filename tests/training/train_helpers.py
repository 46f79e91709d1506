"""Helpers for the trainer tests: tiny synthetic NIfTI datasets preprocessed by nnU-Net's real CLI,
the test-sized trainer module, and running CLIs in subprocesses (fixtures: conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from nnunetv2.dataset_conversion.generate_dataset_json import generate_dataset_json

from nnunet_dro.data.synthetic_shapes import noisy_sphere
from nnunet_dro.ext_trainers import TRAINER_DIR

BIN = Path(sys.executable).parent
NUM_CASES = 6
SHAPE = (24, 24, 24)

TEST_TRAINER_MODULE = '''
"""Test-sized subclasses of the DRO trainers (found through nnUNet_extTrainer)."""
import os
from dataclasses import replace

import numpy as np
import torch

from nnunet_dro.lab.variants import nnUNetTrainerDROAdaptive_fromStart
from nnunet_dro.training import (
    nnUNetTrainerCaseWeights,
    nnUNetTrainerDRO,
    nnUNetTrainerDROAdaptive,
    nnUNetTrainerDROAdaptive_errorSet,
    nnUNetTrainerDROAdaptive_errorSet_refresh70,
    nnUNetTrainerGroupDRO,
)
from nnunet_dro.training.short_run import ShortRun


class TestSize(ShortRun):
    """2 epochs of 3 iterations (nnUNet_dro_short_run=EPOCHS changes the epochs), a checkpoint every
    epoch, one torch thread: nnUNetv2_train gives torch every core on CPU, and the suite runs one
    training per core side by side (pytest-xdist), so two threads each would only oversubscribe
    them (the lab's budget trainers do the same; threads change no result beyond float rounding);
    nnU-Net's progress.png after the last epoch only (drawing it costs more than a test epoch)."""

    short_plot_every = 0

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.save_every = 1
        torch.set_num_threads(1)  # after nnUNetv2_train's set_num_threads(cpu_count())

    def perform_actual_validation(self, save_probabilities: bool = False):
        # the e2e tests run nnU-Net's full validation once, through --val --npz (saves minutes)
        if os.environ.get('DRO_TEST_SKIP_FINAL_VALIDATION') == '1':
            self.print_to_log_file('e2e test: final validation skipped')
            return
        super().perform_actual_validation(save_probabilities)

    def on_train_start(self):
        super().on_train_start()
        # the state the data-augmentation workers start from (checked by the resume tests)
        np.save(os.path.join(self.output_folder, 'dro_losses_at_start.npy'), np.array(self.case_weighting.losses))
        np.save(os.path.join(self.output_folder, 'dro_counts_at_start.npy'), np.array(self.case_weighting.draw_counts))
        np.save(os.path.join(self.output_folder, 'dro_beta_at_start.npy'), np.array(self.case_weighting.current_beta))


class nnUNetTrainerDRO_e2eTest(TestSize, nnUNetTrainerDRO):
    pass


class nnUNetTrainerDROAdaptive_e2eTest(TestSize, nnUNetTrainerDROAdaptive_fromStart):
    """The default's robust phase from the first epoch (a two-epoch run never leaves its ERM phase;
    that phase has a test of its own, nnUNetTrainerDROAdaptive_untilLearned_e2eTest)."""


class nnUNetTrainerDROAdaptive_guard_e2eTest(TestSize, nnUNetTrainerDROAdaptive_fromStart):
    """The default's robust phase (its stability guard on) with a scripted pseudo-Dice: DRO_TEST_FORCED_DICE holds
    one value per epoch (';'-separated) that replaces every structure's logged pseudo-Dice after
    nnU-Net's own validation of that epoch, so a test can make a learned structure 'lost'."""

    def on_validation_epoch_end(self, val_outputs):
        super().on_validation_epoch_end(val_outputs)
        script = [float(v) for v in os.environ['DRO_TEST_FORCED_DICE'].split(';')]
        logged = self.logger.local_logger.my_fantastic_logging['dice_per_class_or_region']
        logged[-1] = [script[min(self.current_epoch, len(script) - 1)]] * len(logged[-1])


class nnUNetTrainerDROAdaptive_guardInErmPhase_e2eTest(nnUNetTrainerDROAdaptive_guard_e2eTest):
    """The scripted pseudo-Dice of the guard test inside an ERM phase that never ends (no scripted
    value reaches 0.95): a back-off and a recovery that must leave the sampling uniform."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_guard_e2eTest.dro_settings, uniform_until_learned=0.95)


class nnUNetTrainerDROAdaptive_untilLearned_e2eTest(TestSize, nnUNetTrainerDROAdaptive):
    """The default's ERM phase, ended by any finite pseudo-Dice: released after epoch 0."""
    dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, uniform_until_learned=0.0)


class nnUNetTrainerGroupDRO_e2eTest(TestSize, nnUNetTrainerGroupDRO):
    dro_settings = replace(nnUNetTrainerGroupDRO.dro_settings, eta=0.5)  # moves q visibly within a few iterations


class nnUNetTrainerCaseWeights_e2eTest(TestSize, nnUNetTrainerCaseWeights):
    pass


class nnUNetTrainerDROAdaptive_errorSet_e2eTest(TestSize, nnUNetTrainerDROAdaptive_errorSet):
    """The error set chosen when the ERM phase ends, after epoch 0 (any pseudo-Dice >= 0)."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_errorSet.dro_settings, uniform_until_learned=0.0)


class nnUNetTrainerDROAdaptive_errorSet_refresh70_e2eTest(TestSize, nnUNetTrainerDROAdaptive_errorSet_refresh70):
    dro_settings = replace(nnUNetTrainerDROAdaptive_errorSet_refresh70.dro_settings, uniform_until_learned=0.0)
'''


def train_env(ds, test_trainer_dir, num_epochs, skip_final_validation=True):
    """nnU-Net's environment for a test-sized training: our trainers and the test trainers found,
    ``num_epochs`` (or ``EPOCHSxITERATIONS``) through nnUNet_dro_short_run."""
    env = dict(ds.env)
    env["DRO_TEST_SKIP_FINAL_VALIDATION"] = "1" if skip_final_validation else "0"
    env["nnUNet_extTrainer"] = os.pathsep.join([TRAINER_DIR, str(test_trainer_dir)])
    env["nnUNet_dro_short_run"] = str(num_epochs)
    return env


@dataclass
class PreprocessedDataset:
    dataset_id: int
    name: str
    env: dict            # environment for nnU-Net subprocesses
    raw: Path
    preprocessed: Path
    results: Path
    test_images: Path    # a folder of images for nnUNetv2_predict

    @property
    def folder_name(self) -> str:
        return f"Dataset{self.dataset_id:03d}_{self.name}"


def run_cli(args, env, timeout=600):
    """Run a real CLI; on failure show its output tail in the assertion message."""
    proc = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"{' '.join(map(str, args))} exited with {proc.returncode}\n"
                                  f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def _write_case(path_img: Path, path_seg: Path | None, rng: np.random.Generator, regions: bool) -> None:
    """A noisy sphere (label 1) with, for the region dataset, an inner core (label 2): the package's
    generator, so tests and benchmarks train on the same shapes."""
    image, seg = noisy_sphere(rng, SHAPE, core=regions)
    affine = np.diag([1.0, 1.0, 1.0, 1.0])
    nib.save(nib.Nifti1Image(image.astype(np.float32), affine), str(path_img))
    if path_seg is not None:
        nib.save(nib.Nifti1Image(seg, affine), str(path_seg))


def make_preprocessed_dataset(tmp_root: Path, dataset_id: int, name: str, regions: bool) -> PreprocessedDataset:
    raw, pre, res = tmp_root / "raw", tmp_root / "preprocessed", tmp_root / "results"
    for p in (raw, pre, res):
        p.mkdir(parents=True, exist_ok=True)
    folder = raw / f"Dataset{dataset_id:03d}_{name}"
    (folder / "imagesTr").mkdir(parents=True)
    (folder / "labelsTr").mkdir()
    test_images = tmp_root / f"test_images_{dataset_id}"
    test_images.mkdir()
    rng = np.random.default_rng(dataset_id)
    for i in range(NUM_CASES):
        _write_case(folder / "imagesTr" / f"case_{i:03d}_0000.nii.gz", folder / "labelsTr" / f"case_{i:03d}.nii.gz",
                    rng, regions)
    _write_case(test_images / "test_000_0000.nii.gz", None, rng, regions)
    labels = {"background": 0, "whole": [1, 2], "core": 2} if regions else {"background": 0, "sphere": 1}
    generate_dataset_json(str(folder), {0: "MRI"}, labels, NUM_CASES, ".nii.gz",
                          regions_class_order=(1, 2) if regions else None, dataset_name=name)
    env = dict(os.environ)
    env.update({
        "nnUNet_raw": str(raw), "nnUNet_preprocessed": str(pre), "nnUNet_results": str(res),
        "nnUNet_compile": "f", "nnUNet_n_proc_DA": "2", "nnUNet_def_n_proc": "2",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
    })
    run_cli([BIN / "nnUNetv2_plan_and_preprocess", "-d", dataset_id, "-c", "3d_fullres", "-np", 2, "-npfp", 2],
            env)
    return PreprocessedDataset(dataset_id, name, env, raw, pre, res, test_images)


def wait_for_checkpoint(proc, latest: Path, epoch: int, within_s: float = 480) -> None:
    """Wait until the running training ``proc`` has saved ``latest`` at ``epoch`` or later (the
    moment a test kills it); fail if the training ends first or takes longer than ``within_s``."""
    deadline = time.monotonic() + within_s
    while not (latest.is_file() and torch.load(str(latest), map_location="cpu", weights_only=False)["current_epoch"]
               >= epoch):
        assert proc.poll() is None, "training ended before it could be killed"
        assert time.monotonic() < deadline, f"no checkpoint at epoch {epoch} within {within_s / 60:g} minutes"
        time.sleep(1)
