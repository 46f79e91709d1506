"""nnUNetTrainerDRO in-process: workers follow the shared case weighting, train_step updates it,
the checkpoint carries 'dro_state' and --c restores it in load_checkpoint (before the loaders)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from batchgenerators.dataloading.nondet_multi_threaded_augmenter import NonDetMultiThreadedAugmenter
from batchgenerators.utilities.file_and_folder_operations import load_json
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunet_dro.lab.variants import nnUNetTrainerDRO_noIS, nnUNetTrainerDROAdaptive_fromStart
from nnunet_dro.training import DRO_STATE_KEY, nnUNetTrainerDRO, nnUNetTrainerDROAdaptive, nnUNetTrainerDROChi2
from nnunet_dro.training.nnunet_compat import compatibility_problems

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def make_trainer(ds, monkeypatch, n_proc_da: int, cls=nnUNetTrainerDRO):
    for key in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results", "nnUNet_compile", "nnUNet_def_n_proc"):
        monkeypatch.setenv(key, ds.env[key])
    monkeypatch.setenv("nnUNet_n_proc_DA", str(n_proc_da))
    folder = ds.preprocessed / ds.folder_name
    plans = load_json(str(folder / "nnUNetPlans.json"))
    plans["continue_training"] = False
    trainer = cls(plans, "3d_fullres", 0, load_json(str(folder / "dataset.json")), device=torch.device("cpu"))
    trainer.initialize()
    return trainer


def shut_down(trainer):
    for loader in (trainer.dataloader_train, trainer.dataloader_val):
        if isinstance(loader, NonDetMultiThreadedAugmenter):
            loader._finish()
    trainer._close_case_weighting()


def test_workers_follow_the_main_process_sampler(label_dataset, monkeypatch):
    """Skew the stale losses in the main process; the real DA worker processes must deliver the
    hard case only (after the batches that were already buffered)."""
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=2)
    dl_tr, _ = trainer.dataloader_train, trainer.dataloader_val = trainer.get_dataloaders()
    try:
        assert isinstance(dl_tr, NonDetMultiThreadedAugmenter) and dl_tr.num_processes == 2
        s = trainer.case_weighting.sampler
        n = s.num_cases
        # batches that may have been drawn before an update: both queues, one in the hand-over
        # thread, one per worker (measured: exactly this many when the queues are full), plus a
        # margin of one per worker for a draw racing the update on a loaded machine
        buffered = 2 * dl_tr.num_cached + 1 + 2 * dl_tr.num_processes
        for hard in (0, n - 1):
            losses = np.zeros(n)
            losses[hard] = 1.0  # beta 100: p(hard) = 1 - (n-1) e^-100
            s.update(np.arange(n), losses)
            skipped = [str(k) for _ in range(buffered) for k in next(dl_tr)["keys"]]
            delivered = [str(k) for _ in range(8) for k in next(dl_tr)["keys"]]
            assert delivered == [trainer.dro_case_ids[hard]] * len(delivered), \
                f"hard case {trainer.dro_case_ids[hard]}; skipped {skipped}; delivered {delivered}"
    finally:
        shut_down(trainer)


@pytest.mark.parametrize("cls", [nnUNetTrainerDRO, nnUNetTrainerDRO_noIS], ids=["IS", "noIS"])
def test_train_step_updates_the_stale_losses_of_the_drawn_cases(label_dataset, monkeypatch, cls):
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=cls)
    trainer.dataloader_train, trainer.dataloader_val = trainer.get_dataloaders()
    try:
        s = trainer.case_weighting.sampler
        before = np.array(s.losses)
        trainer.network.train()
        trainer.on_train_epoch_start()
        batch = next(trainer.dataloader_train)
        idx = trainer._batch_indices(batch["keys"])
        out = trainer.train_step(batch)
        after = np.array(s.losses)
        untouched = np.setdiff1d(np.arange(s.num_cases), idx)
        np.testing.assert_array_equal(after[untouched], before[untouched])
        assert np.all(after[idx] != before[idx]) and np.all(np.isfinite(after[idx]))
        assert s.draw_counts.sum() == len(idx)
        if len(set(idx.tolist())) in (1, len(idx)):
            assert math.isclose(float(out["loss"]), float(after[idx].mean()), rel_tol=1e-9)
        if cls.dro_settings.importance.enabled:
            assert trainer.case_weighting.counters.num_weights == len(idx)
            # the initial stale loss lies far above a fresh loss: beta*(l - L) << log 0.1, clipped
            assert trainer.case_weighting.counters.num_clipped == len(idx)
        else:
            assert trainer.case_weighting.counters.num_weights == 0
    finally:
        shut_down(trainer)


def test_checkpoint_carries_dro_state_and_resume_restores_it_before_loaders(label_dataset, monkeypatch, tmp_path):
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0)
    trainer.dataloader_train, trainer.dataloader_val = trainer.get_dataloaders()
    try:
        s = trainer.case_weighting.sampler
        rng = np.random.default_rng(1)
        s.update(np.arange(s.num_cases), rng.uniform(-1, 0, s.num_cases))
        s.update([0, 0, 1], [0.1, 0.3, -0.2])
        trainer._dro_history["epoch"].append(0)  # a recorded epoch survives the round trip
        for k in trainer._dro_history:
            if k != "epoch":
                trainer._dro_history[k].append(0.5)
        path = tmp_path / "checkpoint_latest.pth"
        trainer.save_checkpoint(str(path))
        saved = torch.load(str(path), weights_only=False)
        # exactly nnU-Net's checkpoint (the keys its own save_checkpoint writes) plus dro_state
        upstream = tmp_path / "upstream.pth"
        nnUNetTrainer.save_checkpoint(trainer, str(upstream))
        assert set(saved) == set(torch.load(str(upstream), weights_only=False)) | {DRO_STATE_KEY}
        assert not list(tmp_path.glob("*.tmp"))  # the atomic write left nothing behind
        state = saved[DRO_STATE_KEY]
        np.testing.assert_array_equal(state["weighting"]["sampler"]["losses"], np.array(s.losses))
        assert state["case_ids"] == trainer.dro_case_ids
        expected_losses, expected_counts = np.array(s.losses), np.array(s.draw_counts)
    finally:
        shut_down(trainer)

    resumed = make_trainer(label_dataset, monkeypatch, n_proc_da=0)
    resumed.load_checkpoint(str(path))  # as nnUNetv2_train --c: before on_train_start
    # applied at once: the case weighting exists since initialize()
    np.testing.assert_array_equal(np.array(resumed.case_weighting.losses), expected_losses)
    resumed.dataloader_train, resumed.dataloader_val = resumed.get_dataloaders()
    try:
        np.testing.assert_array_equal(np.array(resumed.case_weighting.losses), expected_losses)
        np.testing.assert_array_equal(np.array(resumed.case_weighting.draw_counts), expected_counts)
        assert resumed._dro_history["epoch"] == [0]
        assert resumed.current_epoch == 1
    finally:
        shut_down(resumed)

    # a checkpoint whose cases differ from the fold's: a clear error, not a silent mix-up
    saved[DRO_STATE_KEY]["case_ids"] = ["other"] * len(saved[DRO_STATE_KEY]["case_ids"])
    torch.save(saved, str(path))
    wrong = make_trainer(label_dataset, monkeypatch, n_proc_da=0)
    with pytest.raises(RuntimeError, match="differ from"):
        wrong.load_checkpoint(str(path))
    wrong._close_case_weighting()

    # a checkpoint without dro_state (e.g. written by nnUNetTrainer): resuming would silently
    # restart the weighting from L_init, so it is an error naming the file
    del saved[DRO_STATE_KEY]
    torch.save(saved, str(path))
    stateless = make_trainer(label_dataset, monkeypatch, n_proc_da=0)
    with pytest.raises(RuntimeError, match=f"{path.name}.*has no 'dro_state'"):
        stateless.load_checkpoint(str(path))
    stateless._close_case_weighting()


def test_importing_the_trainers_leaves_torch_save_and_load_untouched():
    code = ("import torch; save, load = torch.save, torch.load; import nnunet_dro.training, nnunet_dro.ext_trainers; "
            "assert torch.save is save and torch.load is load, 'torch.save/torch.load replaced'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_installed_nnunet_has_the_shape_nnunet_compat_mirrors():
    problems = compatibility_problems()
    assert not problems, "nnunetv2 changed shape:\n" + "\n".join(problems)


class _CapTrainerForFewCases(nnUNetTrainerDROAdaptive_fromStart):
    # the test dataset has 4-5 training cases: a cap of 5 / n would not bind
    dro_settings = replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings, max_weight=1.5)


def test_cap_trainer_builds_a_capped_scale_free_scheme(label_dataset, monkeypatch):
    """``max_weight`` reaches the scheme: one very hard case is held at c / n of the draws."""
    default = nnUNetTrainerDROAdaptive.dro_settings
    assert (default.max_weight, default.fraction, default.importance.enabled) == (5.0, 0.5, False)
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=_CapTrainerForFewCases)
    try:
        w = trainer.case_weighting
        n = w.num_cases
        assert w.max_weight == 1.5 and n > 1.5
        losses = np.zeros(n)
        losses[0] = 10.0
        w.update(np.arange(n), losses)
        assert w.probabilities()[0] == pytest.approx(1.5 / n, rel=1e-9)
        assert w.state_dict()["loss_ceiling"] == w.sampler.ceiling < 10.0
    finally:
        trainer._close_case_weighting()


class _UntilLearnedForFewCases(nnUNetTrainerDROAdaptive):
    # the test dataset has 4-5 training cases: a cap of 5 / n would not bind
    dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, max_weight=None)


@pytest.mark.parametrize("released", [False, True])
def test_until_learned_trainer_is_uniform_until_every_structure_is_learned_and_resumes_so(
        label_dataset, monkeypatch, tmp_path, released):
    """Uniform draws while any structure's pseudo-Dice is below 0.2 (NaN, an absent structure, is
    not held against it); robust weighting once all are at least 0.2; the phase survives ``--c``."""
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=_UntilLearnedForFewCases)
    path = tmp_path / "checkpoint_latest.pth"
    try:
        w = trainer.case_weighting
        n = w.num_cases
        w.update(np.arange(n), np.linspace(0.1, 2.0, n))
        uniform = np.full(n, 1.0 / n)
        assert w.held_uniform and "until released" in w.describe()
        np.testing.assert_allclose(w.probabilities(), uniform, rtol=1e-9)
        for not_yet in ([], [[0.9, 0.19]], [[0.9, 0.9], [0.0, 0.9]], [[float("nan"), float("nan")]]):
            trainer._release_when_learned(not_yet)
            assert w.held_uniform
        if released:
            trainer._release_when_learned([[0.1, 0.0], [0.2, float("nan")]])
            assert not w.held_uniform
            p = w.probabilities()
            assert p.argmax() == n - 1 and np.exp(-(p * np.log(p)).sum()) == pytest.approx(0.5 * n, rel=1e-6)
            trainer._release_when_learned([[0.0, 0.0]])  # released for good: a later dip does not hold it again
            assert not w.held_uniform
        trainer.save_checkpoint(str(path))
        expected = w.probabilities()
    finally:
        shut_down(trainer)
    resumed = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=_UntilLearnedForFewCases)
    try:
        resumed.load_checkpoint(str(path))
        assert resumed.case_weighting.held_uniform is not released
        np.testing.assert_allclose(resumed.case_weighting.probabilities(), expected, rtol=1e-9)
    finally:
        resumed._close_case_weighting()


def test_an_erm_phase_cannot_be_written_on_a_non_adaptive_scheme():
    """The ERM phase, the guard and the outlier trim belong to the adaptive scheme: the other
    schemes' settings have no such field, so the combination cannot be written (replace() refuses)."""
    for settings in (nnUNetTrainerDRO.dro_settings, nnUNetTrainerDROChi2.dro_settings):
        for field_name, value in (("uniform_until", 0.5), ("uniform_until_learned", 0.0), ("guard", True),
                                  ("trim_fraction", 0.05)):
            with pytest.raises(TypeError, match=field_name):
                replace(settings, **{field_name: value})


class _TrimmedForFewCases(nnUNetTrainerDROAdaptive):
    # the test dataset has 4-5 training cases: a cap of 5 / n would not bind
    dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, max_weight=None, trim_fraction=0.2)


def test_trimmed_cases_are_drawn_at_the_uniform_rate_and_logged(label_dataset, monkeypatch):
    """With the outlier trim, once robust weighting starts the hardest case is drawn at 1 / n and the
    epoch's log names it."""
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=_TrimmedForFewCases)
    try:
        w = trainer.case_weighting
        n = w.num_cases
        w.update(np.arange(n), np.linspace(0.1, 2.0, n))
        w.release()  # the ERM phase over, as after every structure is learned
        assert w.probabilities()[n - 1] == pytest.approx(1.0 / n)
        trainer._record_and_log_dro_statistics()
        with open(trainer.log_file) as f:
            lines = [line for line in f if "DRO: trimmed" in line]
        assert len(lines) == 1 and lines[0].rstrip().endswith(trainer.dro_case_ids[n - 1])
    finally:
        trainer._close_case_weighting()


def test_progress_png_is_paced_after_epochs_and_drawn_at_the_end(label_dataset, monkeypatch):
    """After an epoch the csv is rewritten and the png only when its time budget allows (the first
    time, then not again within 1 % of the drawing's cost); the end of training always redraws."""
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0)
    try:
        folder = trainer.output_folder
        csv, png = f"{folder}/dro_hardness.csv", f"{folder}/dro_progress.png"
        trainer.write_hardness_report(redraw_now=False)
        assert os.path.isfile(csv) and os.path.isfile(png)
        os.remove(csv)
        os.remove(png)
        trainer.write_hardness_report(redraw_now=False)  # a drawing of ~0.3 s is not due again for ~30 s
        assert os.path.isfile(csv) and not os.path.exists(png)
        trainer.write_hardness_report()
        assert os.path.isfile(png)
    finally:
        trainer._close_case_weighting()


class _BadProgressFraction(nnUNetTrainerDRO):
    dro_progress_time_fraction = 0.0


def test_a_progress_fraction_outside_zero_one_stops_the_start(label_dataset, monkeypatch):
    with pytest.raises(RuntimeError, match=r"^_BadProgressFraction\.dro_progress_time_fraction: fraction must be in "
                                           r"\(0, 1\], got 0\.0$"):
        make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=_BadProgressFraction)


def test_a_step_with_weights_known_before_the_losses_is_the_step_with_weights_after_them(
        label_dataset, monkeypatch):
    """Importance weights off: the weights go to the device before the forward pass and the losses
    come to the host after the step (no wait for the forward pass on a GPU). The step must be the
    one the trainer takes when it waits: same parameters, same fresh losses, same reported loss."""
    import copy

    results, batch = [], None
    for wait in (False, True):
        torch.manual_seed(0)  # the same initial network
        trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=nnUNetTrainerDRO_noIS)
        trainer.dataloader_train, trainer.dataloader_val = trainer.get_dataloaders()
        try:
            if wait:
                monkeypatch.setattr(trainer.case_weighting, "weights_before_loss", lambda *a, **k: None)
            else:
                assert trainer.case_weighting.weights_before_loss([0]) is not None
                batch = next(trainer.dataloader_train)  # the same batch for both
            trainer.network.train()
            trainer.on_train_epoch_start()
            idx = trainer._batch_indices(batch["keys"])
            out = trainer.train_step(copy.deepcopy(batch))
            results.append((float(out["loss"]), np.array(trainer.case_weighting.losses)[idx],
                            [p.detach().clone() for p in trainer.network.parameters()]))
        finally:
            shut_down(trainer)
    (loss_a, fresh_a, params_a), (loss_b, fresh_b, params_b) = results
    assert loss_a == loss_b
    np.testing.assert_array_equal(fresh_a, fresh_b)
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
