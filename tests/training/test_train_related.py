"""The related-method trainers (chi-square DRO sampling, KL reweighting, learning to reweight):
class attributes, the L2RW validation subset, and end to end through nnU-Net's real
``nnUNetv2_train`` (1 epoch of 2 iterations on the session's tiny preprocessed dataset)."""
from __future__ import annotations

import inspect
import os
import textwrap

import numpy as np
import pytest
import torch

import nnunet_dro.training as training
from nnunet_dro.ext_trainers import TRAINER_DIR
from nnunet_dro.training.related import choose_validation_cases
from nnunet_dro.training.short_run import SHORT_RUN_ENV
from train_helpers import BIN, run_cli

RELATED_TEST_TRAINERS = '''
"""Test-sized subclasses of the related-method trainers (found through nnUNet_extTrainer)."""
from nnunet_dro.training import nnUNetTrainerDROChi2, nnUNetTrainerDROReweight, nnUNetTrainerL2RW
from nnunet_dro.training.short_run import ShortRun


class TestSize(ShortRun):
    short_epochs, short_iterations, short_val_iterations = 1, 2, 1

    def perform_actual_validation(self, save_probabilities: bool = False):
        self.print_to_log_file('e2e test: final validation skipped')


class nnUNetTrainerDROChi2_e2eTest(TestSize, nnUNetTrainerDROChi2):
    pass


class nnUNetTrainerDROReweight_e2eTest(TestSize, nnUNetTrainerDROReweight):
    pass


class nnUNetTrainerL2RW_e2eTest(TestSize, nnUNetTrainerL2RW):
    pass
'''

# the related methods a user trains (their warm-up ablations are the lab's variants)
NEW_TRAINERS = ["nnUNetTrainerDROChi2", "nnUNetTrainerDROReweight", "nnUNetTrainerL2RW"]


# ---------------------------------------------------------------------- cheap checks
@pytest.mark.parametrize("name, divergence, beta, importance_sampling, warmup", [
    ("nnUNetTrainerDROChi2", "chi2", 10.0, False, True),
    ("nnUNetTrainerDROChi2_noWarmup", "chi2", 10.0, False, False),
    ("nnUNetTrainerDRO_warmup", "kl", 100.0, True, True),
    ("nnUNetTrainerDRO", "kl", 100.0, True, False),
])
def test_sampling_variants_only_set_attributes(name, divergence, beta, importance_sampling, warmup):
    from nnunet_dro.lab.variants import LAB_VARIANTS

    cls = {**training.TRAINERS, **LAB_VARIANTS}[name]
    assert issubclass(cls, training.nnUNetTrainerDRO)
    settings = cls.dro_settings
    assert (settings.scheme, settings.beta, settings.importance.enabled, settings.warmup) == \
        (divergence, beta, importance_sampling, warmup)
    if name != "nnUNetTrainerDRO":
        assert "__init__" not in vars(cls) and not [k for k, v in vars(cls).items() if callable(v)]


def test_new_trainers_are_exported_and_keep_nnunet_constructor_signature():
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    expected = list(inspect.signature(nnUNetTrainer.__init__).parameters)
    for name in NEW_TRAINERS:
        assert name in training.__all__
        cls = getattr(training, name)
        assert issubclass(cls, nnUNetTrainer)
        assert list(inspect.signature(cls.__init__).parameters) == expected
    # weighting trainers keep nnU-Net's uniform loader
    for cls in (training.nnUNetTrainerDROReweight, training.nnUNetTrainerL2RW):
        assert not issubclass(cls, training.nnUNetTrainerDRO)


@pytest.mark.parametrize("num_cases, fraction, minimum, expected", [
    (1, 0.1, 2, 1),      # never more cases than exist
    (4, 0.1, 2, 2),      # the minimum
    (30, 0.1, 2, 3),     # 10%
    (100, 0.1, 2, 10),
    (100, 0.0, 5, 5),
    (7, 1.0, 2, 7),      # everything
])
def test_l2rw_validation_subset_size_and_determinism(num_cases, fraction, minimum, expected):
    cases = [f"case_{i:03d}" for i in range(num_cases)]
    chosen = choose_validation_cases(cases, fraction, minimum, seed=3)
    assert len(chosen) == expected and len(set(chosen)) == expected and set(chosen) <= set(cases)
    assert chosen == sorted(chosen)
    # same subset whatever the order of the identifiers (nnU-Net's split order may vary)
    assert choose_validation_cases(cases[::-1], fraction, minimum, seed=3) == chosen


def test_l2rw_validation_subset_rejects_empty_fold():
    with pytest.raises(ValueError, match="at least one training case"):
        choose_validation_cases([], 0.1, 2, seed=0)


def test_reweight_schedule_is_increasingly_robust_and_the_reweighter_follows_it():
    cls = training.nnUNetTrainerDROReweight
    settings = cls.dro_settings
    starts = [s for s, _ in settings.schedule]
    temperatures = [r for _, r in settings.schedule]
    assert starts[0] == 0.0 and starts == sorted(starts)
    assert temperatures == sorted(temperatures, reverse=True)  # r decreases: beta = 1/r grows
    from nnunet_dro.weighting.kl_reweighter import KLReweighter
    rw = KLReweighter(settings.schedule, settings.momentum, settings.clip)
    losses = np.array([0.1, 0.4])  # a spread typical of nnU-Net's Dice+CE per case
    early, late = rw.weights(losses, progress=0.0), rw.weights(losses, progress=0.99)
    assert early[1] / early[0] == pytest.approx(np.exp(0.3 / temperatures[0]))
    assert late[1] / late[0] == pytest.approx(np.exp(0.3 / temperatures[-1]))


# ---------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def related_trainer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ext_trainers_related")
    (folder / "dro_related_test_trainers.py").write_text(textwrap.dedent(RELATED_TEST_TRAINERS))
    return folder


def train(ds, trainer_dir, trainer, num_epochs=1, *extra):
    env = dict(ds.env)
    env["nnUNet_extTrainer"] = os.pathsep.join([TRAINER_DIR, str(trainer_dir)])
    env[SHORT_RUN_ENV] = str(num_epochs)
    run_cli([BIN / "nnUNetv2_train", ds.dataset_id, "3d_fullres", 0, "-tr", trainer, "-device", "cpu", *extra], env)
    folder = ds.results / ds.folder_name / f"{trainer}__nnUNetPlans__3d_fullres" / "fold_0"
    checkpoint = torch.load(str(folder / "checkpoint_final.pth"), map_location="cpu", weights_only=False)
    log = "".join(p.read_text() for p in sorted(folder.glob("training_log_*.txt")))
    return checkpoint, log


@pytest.mark.slow
def test_chi2_trainer_trains_with_nnunet_cli(label_dataset, related_trainer_dir):
    checkpoint, log = train(label_dataset, related_trainer_dir, "nnUNetTrainerDROChi2_e2eTest")
    state = checkpoint["dro_state"]
    assert state["scheme"] == "chi2" and state["config"]["warmup"] is True
    assert state["weighting"]["sampler"]["divergence"] == "chi2"
    batch_size = checkpoint["init_args"]["plans"]["configurations"]["3d_fullres"]["batch_size"]
    counts = np.asarray(state["weighting"]["sampler"]["draw_counts"])
    assert counts.sum() == 2 * batch_size
    losses = np.asarray(state["weighting"]["sampler"]["losses"])
    assert np.all(np.isfinite(losses))
    # fresh losses replaced the initial value (L_init) of the drawn cases, and only theirs
    from nnunet_dro.training.trainer import DEFAULT_INIT_LOSS
    assert np.all(losses[counts > 0] < 0.5 * DEFAULT_INIT_LOSS)
    assert np.all(np.abs(losses[counts == 0] - DEFAULT_INIT_LOSS) < 1e-3)
    assert "hardness weighted sampling (chi2)" in log and "uniform warm-up pass first" in log
    assert "DRO: beta 10, perplexity" in log
    assert np.isfinite(state["history"]["robust_loss"][0])


@pytest.mark.slow
def test_reweight_trainer_trains_with_nnunet_cli(label_dataset, related_trainer_dir):
    checkpoint, log = train(label_dataset, related_trainer_dir, "nnUNetTrainerDROReweight_e2eTest")
    state = checkpoint["dro_state"]
    assert state["scheme"] == "kl_reweight"
    assert state["weighting"]["reweighter"]["r"] == training.nnUNetTrainerDROReweight.dro_settings.schedule[0][1]
    assert np.isfinite(state["weighting"]["reweighter"]["log_u"])
    assert "KL reweighting: uniform draws" in log and "DRO: beta 1, perplexity" in log
    # the latest loss of the cases it saw is kept for the hardness report
    assert np.isfinite(state["weighting"]["losses"]).sum() >= 1
    assert np.isfinite(checkpoint["logging"]["train_losses"][-1])


def test_reweight_checkpoint_round_trip_restores_the_running_mean(label_dataset, monkeypatch, tmp_path):
    """What ``--c`` does: nnU-Net's load_checkpoint on a fresh trainer restores (log_u, r)."""
    from batchgenerators.utilities.file_and_folder_operations import load_json

    ds = label_dataset
    for key in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results", "nnUNet_compile", "nnUNet_def_n_proc"):
        monkeypatch.setenv(key, ds.env[key])
    folder = ds.preprocessed / ds.folder_name

    def make():
        plans = load_json(str(folder / "nnUNetPlans.json"))
        plans["continue_training"] = False
        trainer = training.nnUNetTrainerDROReweight(plans, "3d_fullres", 0, load_json(str(folder / "dataset.json")),
                                                    device=torch.device("cpu"))
        trainer.initialize()
        return trainer

    trainer = make()
    trainer.case_weighting.set_progress(0.5)
    trainer.case_weighting.update([0, 1], [0.2, 0.5])
    trainer.case_weighting.update([2, 1], [0.1, 0.3])
    expected = trainer.case_weighting.reweighter.state_dict()
    assert expected["r"] == 0.1 and np.isfinite(expected["log_u"])
    path = tmp_path / "checkpoint_latest.pth"
    trainer.save_checkpoint(str(path))
    saved = torch.load(str(path), map_location="cpu", weights_only=False)
    assert saved["dro_state"]["weighting"]["reweighter"] == expected

    resumed = make()
    assert resumed.case_weighting.reweighter.state_dict() == {"log_u": None, "r": None}
    resumed.load_checkpoint(str(path))
    assert resumed.case_weighting.reweighter.state_dict() == expected
    np.testing.assert_array_equal(resumed.case_weighting.draw_counts, trainer.case_weighting.draw_counts)
    # the next batch at the same temperature continues the running mean instead of restarting it
    fresh = make()
    for t in (fresh, resumed):
        t.case_weighting.set_progress(0.5)
        t.case_weighting.update([0, 0], [0.4, 0.4])
    assert resumed.case_weighting.reweighter.log_u != fresh.case_weighting.reweighter.log_u


@pytest.mark.slow
def test_l2rw_trainer_trains_with_nnunet_cli(label_dataset, related_trainer_dir):
    checkpoint, log = train(label_dataset, related_trainer_dir, "nnUNetTrainerL2RW_e2eTest")
    assert checkpoint["current_epoch"] == 1
    assert all(torch.isfinite(v).all() for v in checkpoint["network_weights"].values() if v.is_floating_point())
    line = next(l for l in log.splitlines() if "L2RW: clean validation batches from" in l)
    chosen = line.split(": ")[-1].split(", ")
    assert len(chosen) == 2 and all(c.startswith("case_") for c in chosen)  # 10% of 4 cases -> the minimum 2
    assert "L2RW:" in log and "batches skipped (all weights 0)" in log
    assert np.isfinite(checkpoint["logging"]["train_losses"][-1])


def test_l2rw_weights_on_an_nnunet_unet_leave_its_parameters_in_place():
    """nnU-Net's U-Net reaches its encoder twice (encoder, decoder.encoder); the look-ahead of
    torch.func must not leave its tensors in the network (the optimiser would lose them)."""
    from dynamic_network_architectures.architectures.unet import PlainConvUNet
    from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
    from nnunetv2.training.loss.deep_supervision import DeepSupervisionWrapper
    from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss

    from nnunet_dro.training.losses import per_sample_loss_from_nnunet
    from nnunet_dro.weighting.learning_to_reweight import learning_to_reweight

    torch.manual_seed(0)
    net = PlainConvUNet(1, 2, (4, 8), torch.nn.Conv3d, 3, (1, 2), (1, 1), 2, (1,), False, torch.nn.InstanceNorm3d,
                        {"eps": 1e-5, "affine": True}, None, None, torch.nn.LeakyReLU, {"inplace": True},
                        deep_supervision=True)
    assert net.decoder.encoder is net.encoder  # the aliasing that trips functional_call
    nnunet_loss = DeepSupervisionWrapper(DC_and_CE_loss(
        {"batch_dice": False, "smooth": 1e-5, "do_bg": False, "ddp": False}, {}, weight_ce=1, weight_dice=1,
        ignore_label=None, dice_class=MemoryEfficientSoftDiceLoss), [1.0, 0.5])
    per_sample = per_sample_loss_from_nnunet(nnunet_loss)
    x = torch.randn(3, 1, 8, 8, 8)
    y = [torch.randint(0, 2, (3, 1, 8 // s, 8 // s, 8 // s)).float() for s in (1, 2)]
    before = [p for p in net.parameters()]
    w = learning_to_reweight(net, per_sample, x, y, x[:2], [t[:2] for t in y], inner_lr=0.01)
    assert [p for p in net.parameters()] == before and all(p.is_leaf for p in net.parameters())
    assert w.shape == (3,) and torch.all(w >= 0) and (w.sum().item() == pytest.approx(1.0) or w.sum() == 0)
    (w * per_sample(net(x), y)).sum().backward()  # the weighted step works afterwards
    assert all(p.grad is not None for p in net.parameters())
