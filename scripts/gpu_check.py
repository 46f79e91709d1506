"""One-shot check of the GPU path as users run it: CUDA training with AMP, torch.compile and
data-augmentation workers, kill and resume, prediction, export, evaluation, and DRO's cost per
iteration against nnU-Net's, all through nnU-Net's real commands, in one process tree.

    python scripts/gpu_check.py                           # one GPU: about 5-8 min, 128^3 patches
    python scripts/gpu_check.py --device cpu --quick      # the same steps on CPU at a tiny size (tests)
    python scripts/gpu_check.py -o /tmp/gpu_check --time-limit 420

Steps (each ok / failed with its reason; a failed step skips the steps that need it):

1. ``environment``: device name, torch, CUDA, nnunetv2 and Python versions.
2. ``cohort``: a synthetic fetal cohort (``nnunet_dro make-synthetic``), 128^3 voxels on a GPU so
   that nnU-Net plans a 128^3 3d_fullres patch; ``nnUNetv2_plan_and_preprocess``.
3. ``train <trainer>``: ``nnUNetv2_train ... -device cuda`` of nnUNetTrainer, nnUNetTrainerDRO,
   nnUNetTrainerDROAdaptive and nnUNetTrainerGroupBalanced (short-run subclasses written to a
   folder of ``nnUNet_extTrainer``: fewer epochs and iterations, nothing else changed), with
   nnU-Net's defaults on CUDA: torch.compile, AMP (autocast + GradScaler), pinned-memory
   augmentation workers, nnU-Net's final validation. Run side by side (``-j``). Afterwards every
   logged train loss, stale loss and importance weight must be finite, no fresh loss skipped as
   non-finite, and the GradScaler's scale finite and positive.
4. ``kill and resume`` (beside the trainings of step 3): nnUNetTrainerDROAdaptive on fold 1
   killed (SIGKILL to its process group) in the epoch after its first checkpoint,
   ``nnunet_dro cleanup-shm``, ``--c``: the workers must start from exactly the checkpoint's stale losses and draw counts, and the run must finish.
5. ``iteration time``: nnUNetTrainer and the DRO trainers built in this process on the device and
   timed step by step, interleaved (the order alternates), ``torch.cuda.synchronize()`` around
   each step, on a quiet host: each trainer's batches fetched first by its own loader, its
   workers stopped, the timed steps cycling through them (the method of
   ``scripts/benchmark_overhead.py``); ratio of medians and median of paired ratios, and what a
   DRO trainer adds at each epoch's end, per nnU-Net epoch of 250 iterations. The ratios are
   reported, not failed (target <= 1.01).
6. ``predict``: ``nnUNetv2_predict`` of the test cases with the ERM and DRO models, side by side
   (and beside step 7).
7. ``export``: ``nnunet_dro export --as-trainer nnUNetTrainer``, installed with
   ``nnUNetv2_install_pretrained_model_from_zip`` into a fresh results folder and predicted by stock
   nnU-Net (``-tr nnUNetTrainer``, no ``nnUNet_extTrainer``): the same segmentations as step 6.
8. ``evaluate``: ``nnunet_dro evaluate`` of the prediction folders per condition.

``--quick`` (CPU, tiny cohort, for the test suite) trains and predicts nnUNetTrainer and
nnUNetTrainerDROAdaptive only (every nnU-Net process costs seconds of imports on a CPU), runs
nnU-Net's final validation for the DRO trainer only, predicts the DRO model only; nnUNetTrainerDRO
and nnUNetTrainerGroupBalanced are still built and timed in-process.

Prints one table and writes the same as JSON (``gpu_check.json`` in the output folder); exits 1 if
any step failed, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent


def tool(name: str) -> Path:
    """A console script of nnU-Net or this package: beside this Python, else on PATH (e.g. after
    ``pip install --target DIR`` with DIR/bin on PATH)."""
    beside = BIN / name
    found = shutil.which(name)
    return beside if beside.exists() or found is None else Path(found)
DATASET_ID = 987
DATASET_NAME = "Dataset987_GPUCheckFetal"
TRAINERS = ("nnUNetTrainer", "nnUNetTrainerDRO", "nnUNetTrainerDROAdaptive", "nnUNetTrainerGroupBalanced")
RESUMED = "nnUNetTrainerDROAdaptive"
SUFFIX = "_gpuCheck"
RATIO_TARGET = 1.01

#: the short-run subclasses, imported by nnU-Net through nnUNet_extTrainer
TRAINER_MODULE = '''
"""Short-run subclasses for scripts/gpu_check.py: fewer epochs and iterations, and the default's
robust phase from the first epoch (a few epochs would not leave its ERM phase); nothing else changed."""
import os
from dataclasses import replace

import numpy as np
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunet_dro.training import nnUNetTrainerDRO, nnUNetTrainerDROAdaptive, nnUNetTrainerGroupBalanced
from nnunet_dro.training.short_run import ShortRun as _ShortRun


class ShortRun(_ShortRun):
    """Sizes from nnUNet_dro_short_run (EPOCHSxITERATIONSxVALIDATION), a checkpoint every epoch."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.save_every = 1

    def perform_actual_validation(self, save_probabilities: bool = False):
        if type(self).__name__ in os.environ['GPU_CHECK_VALIDATE'].split(','):
            super().perform_actual_validation(save_probabilities)
        else:
            self.print_to_log_file('gpu_check: final validation left out for this trainer (--quick)')

    def on_train_start(self):
        super().on_train_start()
        weighting = getattr(self, 'case_weighting', None)
        if weighting is not None:  # the state the augmentation workers start from (kill-and-resume check)
            np.save(os.path.join(self.output_folder, 'dro_losses_at_start.npy'), np.array(weighting.losses))
            np.save(os.path.join(self.output_folder, 'dro_counts_at_start.npy'), np.array(weighting.draw_counts))


class nnUNetTrainer_gpuCheck(ShortRun, nnUNetTrainer):
    pass


class nnUNetTrainerDRO_gpuCheck(ShortRun, nnUNetTrainerDRO):
    pass


class nnUNetTrainerDROAdaptive_gpuCheck(ShortRun, nnUNetTrainerDROAdaptive):
    # a few epochs never leave the default's ERM phase: check the robust phase under AMP, compile and
    # workers, the phase with non-uniform draws and beta solves
    dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, uniform_until_learned=None)


class nnUNetTrainerGroupBalanced_gpuCheck(ShortRun, nnUNetTrainerGroupBalanced):
    pass
'''


def side_by_side(*calls) -> None:
    """Run the calls in threads (each mostly waits on a subprocess); raise the first error any raised."""
    errors: list[BaseException] = []

    def guarded(call):
        try:
            call()
        except BaseException as e:  # noqa: BLE001  (re-raised below, in the calling thread)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@dataclass(frozen=True)
class Sizes:
    """How big the check is: the GPU size, or the CPU ``--quick`` size of the test suite."""
    size: int = 128            # voxels per side of the cohort's volumes (nnU-Net plans a 128^3 patch)
    n_train: int = 10
    n_test: int = 3
    epochs: int = 2
    iterations: int = 20
    val_iterations: int = 2
    resume_epochs: int = 3
    timed_iterations: int = 60
    warmup_iterations: int = 8  # torch.compile compiles in the first steps
    timing_workers: int = 3    # augmentation workers per trainer that fill the pool of timing batches
    timing_batches: int = 8    # batches per trainer fetched before timing, then stepped on in turn
    workers: int = 4           # nnUNet_n_proc_DA per training
    processes: int = max(2, min(8, os.cpu_count() or 2))  # nnUNet_def_n_proc (final validation's pools)
    predict_workers: int = 2   # nnUNetv2_predict -npp and -nps
    trainers: tuple = TRAINERS  # trained through nnUNetv2_train (the others are only timed, in-process)
    validated: tuple = TRAINERS  # run nnU-Net's final validation
    predicted: tuple = ("nnUNetTrainer", RESUMED)  # predict the test cases with nnUNetv2_predict


GPU_SIZES = Sizes()
# on CPU every nnU-Net process costs seconds of imports: train (and predict with) the default DRO
# trainer and ERM only, with one worker per nnU-Net pool (still spawned, still nnU-Net's own code);
# nnUNetTrainerDRO and nnUNetTrainerGroupBalanced are still timed in-process
QUICK_SIZES = Sizes(size=24, n_train=6, n_test=2, epochs=1, iterations=2, val_iterations=1, resume_epochs=3,
                    timed_iterations=3, warmup_iterations=1, timing_workers=0, timing_batches=2, workers=2, processes=1,
                    predict_workers=1, trainers=("nnUNetTrainer", RESUMED),
                    validated=(RESUMED,), predicted=(RESUMED,))


@dataclass
class Step:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Report:
    device: str = ""
    versions: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    timing: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)


class StepFailed(Exception):
    """A step's check did not hold (its message is the one-line reason)."""


class GPUCheck:
    def __init__(self, out: Path, device: str, sizes: Sizes, jobs: int, time_limit: float):
        self.out, self.device, self.sizes, self.jobs = out, device, sizes, max(1, jobs)
        self.deadline = time.monotonic() + time_limit
        self.report = Report()
        self.failed: set[str] = set()
        self._predicted = threading.Event()  # set once the step predict has ended
        self._predicted.set()
        self.ext = out / "ext_trainers"
        self.raw, self.pre, self.results = out / "nnUNet_raw", out / "nnUNet_preprocessed", out / "nnUNet_results"
        self.env = self._environment()

    # ------------------------------------------------------------------ plumbing
    def _environment(self) -> dict:
        from nnunet_dro.ext_trainers import TRAINER_DIR
        from nnunet_dro.training.short_run import SHORT_RUN_ENV, short_run_value

        env = dict(os.environ)
        env.update({
            "nnUNet_raw": str(self.raw), "nnUNet_preprocessed": str(self.pre), "nnUNet_results": str(self.results),
            "nnUNet_extTrainer": os.pathsep.join([TRAINER_DIR, str(self.ext)]),
            "nnUNet_n_proc_DA": str(self.sizes.workers), "nnUNet_def_n_proc": str(self.sizes.processes),
            SHORT_RUN_ENV: short_run_value(self.sizes.epochs, self.sizes.iterations, self.sizes.val_iterations),
            "PYTHONWARNINGS": "ignore",
            "GPU_CHECK_VALIDATE": ",".join(t + SUFFIX for t in self.sizes.validated),
        })
        env.pop("nnUNet_compile", None)  # nnU-Net's default: compile on CUDA, off on CPU
        return env

    @contextmanager
    def step(self, name: str, needs: tuple[str, ...] = ()):
        """Run one step: record ok / failed with a one-line reason; skipped (failed) when a step it
        needs failed or the time limit has passed."""
        start = time.monotonic()
        missing = [n for n in needs if n in self.failed]
        if missing or time.monotonic() > self.deadline:
            reason = f"skipped: {', '.join(missing)} failed" if missing else "skipped: time limit reached"
            self._record(name, False, 0.0, reason)
            yield None
            return
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            detail: dict = {}
            yield detail
            self._record(name, True, time.monotonic() - start, detail.get("text", ""))
        except StepFailed as e:
            self._record(name, False, time.monotonic() - start, str(e))
        except Exception as e:  # noqa: BLE001  (a check reports every failure as a row, then goes on)
            self._record(name, False, time.monotonic() - start, f"{type(e).__name__}: {e}".splitlines()[0])
            traceback.print_exc()

    def _record(self, name: str, ok: bool, seconds: float, detail: str) -> None:
        if not ok:
            self.failed.add(name)
        self.report.steps.append(Step(name, ok, round(seconds, 1), detail))
        print(f"[gpu_check] {name}: {'ok' if ok else 'FAILED'} ({seconds:.0f} s) {detail}", flush=True)

    def _remaining(self) -> float:
        return max(10.0, self.deadline - time.monotonic())

    def cli(self, *args, env: dict | None = None, log: str | None = None) -> subprocess.CompletedProcess:
        """A real CLI in a subprocess; its output goes to ``logs/``; a non-zero exit fails the step
        with the last line of its output."""
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        name = log or Path(str(args[0])).name
        proc = subprocess.run([str(a) for a in args], env=env or self.env, capture_output=True, text=True,
                              timeout=self._remaining())
        (logs / f"{name}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        if proc.returncode != 0:
            tail = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
            raise StepFailed(f"{name} exited with {proc.returncode}: {tail[-1] if tail else ''} (logs/{name}.log)")
        return proc

    def fold_folder(self, trainer: str, fold: int = 0, results: Path | None = None) -> Path:
        return (results or self.results) / DATASET_NAME / f"{trainer}__nnUNetPlans__3d_fullres" / f"fold_{fold}"

    def train_args(self, trainer: str, fold: int = 0, *extra) -> list:
        return [tool("nnUNetv2_train"), DATASET_ID, "3d_fullres", fold, "-tr", trainer + SUFFIX,
                "-device", self.device, *extra]

    # ------------------------------------------------------------------ steps
    def run(self) -> Report:
        for folder in (self.raw, self.pre, self.results, self.ext):
            folder.mkdir(parents=True, exist_ok=True)
        (self.ext / "gpu_check_trainers.py").write_text(textwrap.dedent(TRAINER_MODULE))
        with self.step("environment") as d:
            if d is not None:
                d["text"] = self.check_environment()
        with self.step("cohort", needs=("environment",)) as d:
            if d is not None:
                d["text"] = self.make_cohort()
        # the kill-and-resume run (fold 1) needs nothing from the fold-0 trainings: it runs beside them
        resume = threading.Thread(target=self._kill_and_resume_step, name="kill-and-resume")
        resume.start()
        self.train_all()
        resume.join()
        with self.step("iteration time", needs=("cohort",)) as d:
            if d is not None:
                d["text"] = self.time_iterations()
        # the predictions and the exported model's stock prediction side by side; compared after both
        self._predicted.clear()
        export = threading.Thread(target=self._export_step, name="export")
        export.start()
        try:
            with self.step("predict", needs=tuple(f"train {t}" for t in self.sizes.trainers)) as d:
                if d is not None:
                    d["text"] = self.predict()
        finally:
            self._predicted.set()
        export.join()
        with self.step("evaluate", needs=("predict", "export")) as d:
            if d is not None:
                d["text"] = self.evaluate()
        # the table in the order of the steps above, whichever of the side-by-side runs ended first
        order = ["environment", "cohort", *(f"train {t}" for t in self.sizes.trainers), "kill and resume"]
        self.report.steps.sort(key=lambda s: order.index(s.name) if s.name in order else len(order))
        return self.report

    def _export_step(self) -> None:
        with self.step("export", needs=(f"train {RESUMED}",)) as d:
            if d is not None:
                d["text"] = self.export_and_predict()

    def _kill_and_resume_step(self) -> None:
        with self.step("kill and resume", needs=("cohort",)) as d:
            if d is not None:
                d["text"] = self.kill_and_resume()

    def check_environment(self) -> str:
        from importlib.metadata import version

        import nnunetv2  # noqa: F401
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise StepFailed("-device cuda but torch.cuda.is_available() is False")
        name = torch.cuda.get_device_name(0) if self.device == "cuda" else platform.processor() or "cpu"
        self.report.device = name
        self.report.versions = {"python": platform.python_version(), "torch": torch.__version__,
                                "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                                "nnunetv2": version("nnunetv2"), "nnunet_dro": version("nnunet_dro")}
        return f"{name}; " + ", ".join(f"{k} {v}" for k, v in self.report.versions.items())

    def make_cohort(self) -> str:
        s = self.sizes
        self.cli(tool("nnunet_dro"), "make-synthetic", "--kind", "fetal", "--id", DATASET_ID, "-n", "GPUCheckFetal",
                 "--n-train", s.n_train, "--n-test", s.n_test, "--size", s.size, "--overwrite", log="make-synthetic")
        procs = max(2, min(8, os.cpu_count() or 2))
        self.cli(tool("nnUNetv2_plan_and_preprocess"), "-d", DATASET_ID, "-c", "3d_fullres", "-np", procs,
                 "-npfp", procs)
        plans = json.loads((self.pre / DATASET_NAME / "nnUNetPlans.json").read_text())
        patch = plans["configurations"]["3d_fullres"]["patch_size"]
        if self.device == "cuda" and min(patch) < 96:
            raise StepFailed(f"nnU-Net planned a 3d_fullres patch of {patch}, smaller than 96^3")
        return f"{s.n_train} + {s.n_test} cases of {s.size}^3, 3d_fullres patch {patch}"

    def train_all(self) -> None:
        """The four trainings side by side (``-j``), each through nnUNetv2_train; then their checks."""
        names = [f"train {t}" for t in self.sizes.trainers]
        if "cohort" in self.failed:
            for name in names:
                self._record(name, False, 0.0, "skipped: cohort failed")
            return
        print(f"[gpu_check] training {', '.join(self.sizes.trainers)} ({self.jobs} at a time) ...", flush=True)
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        pending = list(self.sizes.trainers)
        running: dict[str, tuple[subprocess.Popen, float, object]] = {}
        while pending or running:
            while pending and len(running) < self.jobs:
                trainer = pending.pop(0)
                log = open(logs / f"train_{trainer}.log", "w")
                running[trainer] = (subprocess.Popen([str(a) for a in self.train_args(trainer)], env=self.env,
                                                     stdout=log, stderr=subprocess.STDOUT), time.monotonic(), log)
            time.sleep(0.5)
            for trainer, (proc, start, log) in list(running.items()):
                if proc.poll() is None and time.monotonic() < self.deadline:
                    continue
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
                del running[trainer]
                seconds = time.monotonic() - start
                try:
                    if proc.returncode != 0:
                        text = (logs / f"train_{trainer}.log").read_text().strip().splitlines()
                        raise StepFailed(f"nnUNetv2_train exited with {proc.returncode}: "
                                         f"{text[-1] if text else ''} (logs/train_{trainer}.log)")
                    detail = self.check_training(trainer)
                    self._record(f"train {trainer}", True, seconds, detail)
                except Exception as e:  # noqa: BLE001
                    self._record(f"train {trainer}", False, seconds, str(e).splitlines()[0])

    def check_training(self, trainer: str) -> str:
        """No NaN/inf in what the run logged and kept; the GradScaler's scale finite (CUDA)."""
        import torch

        folder = self.fold_folder(trainer + SUFFIX)
        checkpoint = torch.load(str(folder / "checkpoint_final.pth"), map_location="cpu", weights_only=False)
        losses = np.asarray(checkpoint["logging"]["train_losses"], dtype=np.float64)
        if losses.size != self.sizes.epochs or not np.isfinite(losses).all():
            raise StepFailed(f"train losses {losses.tolist()} (expected {self.sizes.epochs} finite values)")
        parts = [f"train loss {losses[-1]:.3f}"]
        scaler = checkpoint.get("grad_scaler_state")
        if self.device == "cuda":
            scale = float((scaler or {}).get("scale", float("nan")))
            if not (np.isfinite(scale) and scale > 0):
                raise StepFailed(f"GradScaler scale {scale} (AMP state {scaler!r})")
            parts.append(f"GradScaler scale {scale:g}")
        state = checkpoint.get("dro_state")
        if trainer != "nnUNetTrainer":
            if state is None:
                raise StepFailed("the checkpoint has no 'dro_state'")
            history = state["history"]
            stale = np.asarray(history["mean_stale_loss"], dtype=np.float64)
            skipped = [int(v or 0) for v in history["num_skipped"]]
            weights = [v for k in ("mean_raw_weight", "max_raw_weight") for v in history.get(k, []) if v is not None]
            if not np.isfinite(stale).all() or any(skipped):
                raise StepFailed(f"mean stale loss per epoch {stale.tolist()}, non-finite fresh losses skipped "
                                 f"{skipped}")
            if np.isinf(np.asarray(weights, dtype=np.float64)).any():  # NaN: importance weights off
                raise StepFailed(f"an importance weight statistic is infinite: {weights}")
            beta = history["beta"][-1]
            parts.append("stale losses finite" + (f", beta {beta:.3g}" if np.isfinite(beta) else ""))
        if trainer not in self.sizes.validated:
            return ", ".join(parts)
        if not (folder / "validation" / "summary.json").is_file():
            raise StepFailed("nnU-Net's final validation wrote no validation/summary.json")
        dice = json.loads((folder / "validation" / "summary.json").read_text())["foreground_mean"]["Dice"]
        parts.append(f"final validation mean Dice {dice:.3f}")
        return ", ".join(parts)

    def kill_and_resume(self) -> str:
        folder = self.fold_folder(RESUMED + SUFFIX, fold=1)
        # no final validation here: the fold-0 runs check it, and it would lengthen the longest path
        from nnunet_dro.training.short_run import SHORT_RUN_ENV, short_run_value

        env = dict(self.env, GPU_CHECK_VALIDATE="")
        env[SHORT_RUN_ENV] = short_run_value(self.sizes.resume_epochs, self.sizes.iterations, self.sizes.val_iterations)
        logs = self.out / "logs"
        with open(logs / "kill_and_resume_first.log", "w") as log:
            proc = subprocess.Popen([str(a) for a in self.train_args(RESUMED, 1)], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            latest = folder / "checkpoint_latest.pth"
            try:
                while not (latest.is_file() and latest.stat().st_size > 0):
                    if proc.poll() is not None:
                        raise StepFailed(f"the run ended (exit {proc.returncode}) before its first checkpoint "
                                         f"(logs/kill_and_resume_first.log)")
                    if time.monotonic() > self.deadline:
                        raise StepFailed("no checkpoint before the time limit")
                    time.sleep(0.2)
                time.sleep(1.0)  # into the next epoch's iterations
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
        if proc.returncode == 0:
            raise StepFailed("the run finished before it could be killed: raise resume_epochs")
        import torch
        saved = torch.load(str(folder / "checkpoint_latest.pth"), map_location="cpu", weights_only=False)
        sampler = saved["dro_state"]["weighting"]["sampler"]
        self.cli(tool("nnunet_dro"), "cleanup-shm", log="cleanup-shm")
        self.cli(*self.train_args(RESUMED, 1, "--c"), env=env, log="kill_and_resume_second")
        if not np.array_equal(np.load(folder / "dro_losses_at_start.npy"), sampler["losses"]) or \
                not np.array_equal(np.load(folder / "dro_counts_at_start.npy"), sampler["draw_counts"]):
            raise StepFailed("the resumed run's sampler state differs from the checkpoint's")
        final = torch.load(str(folder / "checkpoint_final.pth"), map_location="cpu", weights_only=False)
        if final["current_epoch"] != self.sizes.resume_epochs:
            raise StepFailed(f"the resumed run ended at epoch {final['current_epoch']}")
        return (f"killed after the checkpoint of epoch {saved['current_epoch'] - 1}; resumed with identical "
                f"stale losses and draw counts ({int(np.sum(sampler['draw_counts']))} draws) and finished")

    def predict(self) -> str:
        images = self.raw / DATASET_NAME / "imagesTs"
        # side by side: each is mostly imports, model loading and writing NIfTI on the host
        side_by_side(*(partial(self.cli, tool("nnUNetv2_predict"), "-i", images, "-o",
                               self.out / "predictions" / trainer, "-d", DATASET_ID, "-c", "3d_fullres", "-f", 0,
                               "-tr", trainer + SUFFIX, "-device", self.device, "-npp", self.sizes.predict_workers,
                               "-nps", self.sizes.predict_workers, log=f"predict_{trainer}")
                       for trainer in self.sizes.predicted))
        for trainer in self.sizes.predicted:
            count = len(list((self.out / "predictions" / trainer).glob("*.nii.gz")))
            if count != self.sizes.n_test:
                raise StepFailed(f"{count} predictions by {trainer} for {self.sizes.n_test} test cases "
                                 f"(logs/predict_{trainer}.log)")
        return f"{self.sizes.n_test} test cases by each of {', '.join(self.sizes.predicted)}"

    def export_and_predict(self) -> str:
        import nibabel as nib

        archive = self.out / "exported_model.zip"
        self.cli(tool("nnunet_dro"), "export", "-d", DATASET_ID, "-o", archive, "-c", "3d_fullres",
                 "-tr", RESUMED + SUFFIX, "-f", 0, "--as-trainer", "nnUNetTrainer", log="export")
        stock = self.out / "stock_results"
        env = {k: v for k, v in self.env.items() if k != "nnUNet_extTrainer"}
        env["nnUNet_results"] = str(stock)
        self.cli(tool("nnUNetv2_install_pretrained_model_from_zip"), archive, env=env, log="install_from_zip")
        out = self.out / "predictions" / "exported"
        self.cli(tool("nnUNetv2_predict"), "-i", self.raw / DATASET_NAME / "imagesTs", "-o", out, "-d", DATASET_ID,
                 "-c", "3d_fullres", "-f", 0, "-tr", "nnUNetTrainer", "-device", self.device,
                 "-npp", self.sizes.predict_workers, "-nps", self.sizes.predict_workers, env=env, log="predict_exported")
        self._predicted.wait()  # the DRO model's own prediction (step "predict"), to compare with
        if "predict" in self.failed:
            raise StepFailed("nothing to compare with: the step predict failed")
        differing = []
        for mine in sorted((self.out / "predictions" / RESUMED).glob("*.nii.gz")):
            a = np.asarray(nib.load(str(mine)).dataobj)
            b = np.asarray(nib.load(str(out / mine.name)).dataobj)
            if a.shape != b.shape or (a != b).mean() > 1e-3:  # cuDNN may break a few ties differently
                differing.append(mine.name)
        if differing:
            raise StepFailed(f"stock nnU-Net's predictions of the exported model differ on {differing}")
        return "stock nnU-Net (-tr nnUNetTrainer, no nnUNet_extTrainer) predicts the exported model identically"

    def evaluate(self) -> str:
        raw = self.raw / DATASET_NAME
        groups = self.out / "subgroups_test.tsv"
        table = [line for line in (raw / "subgroups.tsv").read_text().splitlines()]
        header = table[0].split("\t")
        split = header.index("split")
        groups.write_text("\n".join([table[0]] + [r for r in table[1:] if r.split("\t")[split] == "test"]) + "\n")
        report = self.out / "report"
        preds = self.out / "predictions"
        methods = [f"ERM={preds / 'nnUNetTrainer'}"] if "nnUNetTrainer" in self.sizes.predicted else []
        methods += [f"DRO={preds / RESUMED}", f"exported={preds / 'exported'}"]
        self.cli(tool("nnunet_dro"), "evaluate", "-ref", raw / "labelsTs", "-pred", *methods, "-o", report, "-groups", groups,
                 "--group-by", "condition", "-regions", "feta", "-np", 2, log="evaluate")
        if not (report / "table.md").is_file():
            raise StepFailed("nnunet_dro evaluate wrote no table.md")
        return f"report in {report}"

    # ------------------------------------------------------------------ timing
    @staticmethod
    def _stop_loaders(trainer) -> None:
        for loader in (trainer.dataloader_train, trainer.dataloader_val):
            if hasattr(loader, "_finish"):  # nnU-Net's multi-process augmenter: stop its workers
                loader._finish()

    def time_iterations(self) -> str:
        """Interleaved per-iteration timing in this process (``scripts/benchmark_overhead.py``'s
        method, with CUDA synchronisation), then the epoch-end additions of each DRO trainer."""
        from nnunet_dro.lab.timing import build_trainer, interleaved_step_times, time_epoch_additions

        for key in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
            os.environ[key] = self.env[key]
        # the pool of timing batches comes from augmentation workers on a GPU (a 128^3 batch takes
        # about a second to augment in one process), on CPU from this process
        os.environ["nnUNet_n_proc_DA"] = str(self.sizes.timing_workers)
        os.environ.pop("nnUNet_compile", None)
        import torch
        from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

        import nnunet_dro.training as training

        classes = {"nnUNetTrainer": nnUNetTrainer, **{t: getattr(training, t) for t in TRAINERS[1:]}}
        trainers = {name: build_trainer(cls, DATASET_ID, self.device) for name, cls in classes.items()}
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        s = self.sizes
        # A quiet host while timing: each trainer's batches are fetched first (by its own loader,
        # its own sampler's draws), its augmentation workers stopped, and the timed steps cycle
        # through them: workers left running beside the timed steps made the paired ratios spread
        # more than the differences they measure (data_docs/benchmark_record/gpu_check_h200).
        for trainer in trainers.values():
            pool = [next(trainer.dataloader_train) for _ in range(s.timing_batches)]
            self._stop_loaders(trainer)
            trainer.dataloader_train = itertools.cycle(pool)
        times = interleaved_step_times(trainers, s.warmup_iterations, s.timed_iterations, sync)
        erm = np.asarray(times["nnUNetTrainer"])
        timing = {"timed_iterations": s.timed_iterations, "warmup_iterations": s.warmup_iterations,
                  "median_seconds": {n: float(np.median(v)) for n, v in times.items()}, "ratios": {}}
        lines = [f"nnUNetTrainer {1e3 * np.median(erm):.1f} ms/iteration"]
        for name in TRAINERS[1:]:
            mine = np.asarray(times[name])
            paired = mine / erm
            q1, q3 = np.percentile(paired, [25, 75])
            entry = {"ratio_of_medians": float(np.median(mine) / np.median(erm)),
                     "median_paired_ratio": float(np.median(paired)), "paired_ratio_iqr": [float(q1), float(q3)]}
            trainer = trainers[name]
            if hasattr(trainer, "case_weighting"):
                stats_cost, csv_cost, with_png = time_epoch_additions(trainer, repeats=3)
                png = max(0.0, with_png - csv_cost)
                epoch = 250 * float(np.median(mine))
                per_epoch = stats_cost + csv_cost + min(png, trainer.dro_progress_time_fraction * epoch)
                entry["epoch_end_seconds"] = per_epoch
                entry["epoch_end_ratio_250_iterations"] = 1 + per_epoch / (250 * float(np.median(erm)))
            timing["ratios"][name] = entry
            lines.append(f"{name} {entry['median_paired_ratio']:.3f} x (IQR {q1:.3f}-{q3:.3f})"
                         + (f", epoch end +{1e3 * entry['epoch_end_seconds']:.0f} ms" if "epoch_end_seconds" in entry
                            else ""))
        for trainer in trainers.values():
            if hasattr(trainer, "_close_case_weighting"):
                trainer._close_case_weighting()
        self.report.timing = timing
        return "; ".join(lines)


def print_report(report: Report) -> None:
    print()
    print(f"GPU check on {report.device or '?'}: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()))
    width = max(len(s.name) for s in report.steps)
    for s in report.steps:
        print(f"  {s.name:<{width}}  {'ok    ' if s.ok else 'FAILED'}  {s.seconds:7.1f} s  {s.detail}")
    for name, entry in report.timing.get("ratios", {}).items():
        flag = "" if entry["median_paired_ratio"] <= RATIO_TARGET else f"  (above the target {RATIO_TARGET})"
        print(f"  iteration time {name}/nnUNetTrainer: median of paired ratios {entry['median_paired_ratio']:.4f} "
              f"(IQR {entry['paired_ratio_iqr'][0]:.4f}-{entry['paired_ratio_iqr'][1]:.4f}), ratio of medians "
              f"{entry['ratio_of_medians']:.4f}{flag}")
    print("all steps ok" if report.ok else "SOME STEPS FAILED")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-device", "--device", default="cuda", choices=["cuda", "cpu"], help="Default: cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (24^3 cohort, 1 epoch of 2 iterations): "
                                                             "what the test suite runs on CPU")
    parser.add_argument("-o", dest="output", default=None,
                        help="output folder (default: a new temporary folder, kept)")
    parser.add_argument("-j", dest="jobs", type=int, default=None,
                        help="trainings side by side. Default: 4 on cuda, 1 on cpu")
    parser.add_argument("--time-limit", type=float, default=480.0,
                        help="seconds after which the remaining steps are skipped (failed). Default: 480")
    args = parser.parse_args(argv)
    out = Path(args.output or tempfile.mkdtemp(prefix="nnunet_dro_gpu_check_")).resolve()
    if out.exists() and any(out.iterdir()):
        parser.error(f"-o {out}: the folder exists and is not empty; give a new one")
    out.mkdir(parents=True, exist_ok=True)
    sizes = QUICK_SIZES if args.quick else GPU_SIZES
    jobs = args.jobs or (len(TRAINERS) if args.device == "cuda" else 1)
    check = GPUCheck(out, args.device, sizes, jobs, args.time_limit)
    report = check.run()
    print_report(report)
    payload = {"ok": report.ok, "device": report.device, "versions": report.versions, "sizes": asdict(sizes),
               "steps": [asdict(s) for s in report.steps], "timing": report.timing}
    tmp = out / "gpu_check.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(out / "gpu_check.json")
    print(f"written: {out / 'gpu_check.json'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
