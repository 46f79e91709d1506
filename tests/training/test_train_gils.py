"""GI-LS (DRO with label smoothing, arXiv:2408.05082): the feature ascent against closed forms, the
trainers' step on a real nnU-Net network (gradient into the body, float32 ascent under autocast),
and end to end through ``nnUNetv2_train`` (both trainers, one short run each, resumed with --c)."""
from __future__ import annotations

import os
import textwrap
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from nnunet_dro.ext_trainers import TRAINER_DIR
from nnunet_dro.training.feature_ascent import ascend_features, penalised_objective
from train_helpers import BIN, run_cli


# ------------------------------------------------------------------ the ascent, pure torch
def _linear_problem(seed=0, d=5, k=3, b=4):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(k, d, generator=g, dtype=torch.float64) * 0.5
    z0 = torch.randn(b, d, generator=g, dtype=torch.float64)
    y = torch.randn(b, k, generator=g, dtype=torch.float64)
    head = lambda z: z @ W.T  # noqa: E731
    loss = lambda out: 0.5 * ((out - y) ** 2).sum(1)  # noqa: E731
    return W, z0, y, head, loss


def test_one_step_is_the_gradient_of_the_loss_at_z0():
    W, z0, y, head, loss = _linear_problem()
    delta = ascend_features(z0.float(), lambda z: z @ W.T.float(), lambda o: 0.5 * ((o - y.float()) ** 2).sum(1),
                            steps=1, step_size=0.3, gamma=7.0, scale=2.0)
    expected = 0.3 * 2.0 * (z0 @ W.T - y) @ W  # the penalty's gradient is 0 at delta = 0
    assert torch.allclose(delta.double(), expected, atol=1e-5)


def test_many_steps_reach_the_maximiser_of_the_penalised_problem():
    """With gamma above the largest eigenvalue of W^T W, loss - gamma/2 ||z - z0||^2 is concave and
    its maximiser solves (gamma I - W^T W) z = gamma z0 - W^T y (per sample)."""
    W, z0, y, head, loss = _linear_problem()
    gram = W.T @ W
    gamma = float(torch.linalg.eigvalsh(gram).max()) + 1.0
    z_star = torch.linalg.solve(gamma * torch.eye(gram.shape[0], dtype=torch.float64) - gram,
                                (gamma * z0 - y @ W).T).T
    delta = ascend_features(z0.float(), lambda z: z @ W.T.float(), lambda o: 0.5 * ((o - y.float()) ** 2).sum(1),
                            steps=400, step_size=0.2, gamma=gamma)
    assert torch.allclose(z0 + delta.double(), z_star, atol=1e-4)
    # the penalty binds: the loss alone would grow without bound along W's directions
    objective = penalised_objective(z0 + delta.double(), z0, head, loss, gamma)
    assert torch.all(objective >= penalised_objective(z0, z0, head, loss, gamma))
    assert torch.all(loss(head(z0 + delta.double())) > loss(head(z0)))


def test_the_penalty_shrinks_the_shift_and_steps_raise_the_objective():
    W, z0, y, head, loss = _linear_problem(seed=1)
    gram_max = float(torch.linalg.eigvalsh(W.T @ W).max())
    gammas = (gram_max + 0.5, gram_max + 2.0, gram_max + 8.0)
    args = dict(head=lambda z: z @ W.T.float(), loss=lambda o: 0.5 * ((o - y.float()) ** 2).sum(1),
                step_size=1.0 / gammas[-1])  # stable: step_size * gamma <= 1
    norms = [ascend_features(z0.float(), steps=50, gamma=g, **args).norm() for g in gammas]
    assert norms[0] > norms[1] > norms[2] > 0
    gamma = gram_max + 0.5
    values = [penalised_objective(z0 + ascend_features(z0.float(), steps=t, gamma=gamma, **args).double(),
                                  z0, head, loss, gamma).sum() for t in range(6)]
    assert all(b > a for a, b in zip(values, values[1:]))


def test_zero_steps_and_bad_settings():
    z0 = torch.randn(2, 3)
    assert torch.equal(ascend_features(z0, lambda z: z, lambda o: o.sum(1), 0, 1.0, 1.0), torch.zeros_like(z0))
    with pytest.raises(ValueError, match="steps"):
        ascend_features(z0, lambda z: z, lambda o: o.sum(1), -1, 1.0, 1.0)


def test_ascent_is_float32_under_autocast_and_leaves_no_parameter_gradient():
    head = torch.nn.Conv3d(4, 2, 1)
    z0 = torch.randn(2, 4, 3, 3, 3).to(torch.bfloat16)
    seen = []

    def loss(out):
        seen.append(out.dtype)
        return F.cross_entropy(out, torch.zeros(2, 3, 3, 3, dtype=torch.long), reduction="none").flatten(1).mean(1)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        delta = ascend_features(z0, head, loss, steps=2, step_size=1.0, gamma=1e-3, scale=27.0)
    assert delta.dtype == torch.float32 and seen == [torch.float32, torch.float32]
    assert head.weight.grad is None and torch.isfinite(delta).all() and delta.abs().sum() > 0


# ------------------------------------------------------------------ the trainers' step on a real network
def _network_and_loss(deep_supervision=True):
    from dynamic_network_architectures.architectures.unet import PlainConvUNet
    from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
    from nnunetv2.training.loss.deep_supervision import DeepSupervisionWrapper
    from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss
    from nnunetv2.utilities.helpers import softmax_helper_dim1

    torch.manual_seed(0)
    net = PlainConvUNet(1, 4, (4, 8, 16, 16), torch.nn.Conv3d, 3, (1, 2, 2, 2), 1, 2, 1, conv_bias=True,
                        norm_op=torch.nn.InstanceNorm3d, norm_op_kwargs={"eps": 1e-5, "affine": True},
                        nonlin=torch.nn.LeakyReLU, deep_supervision=deep_supervision)
    loss = DC_and_CE_loss({"batch_dice": False, "smooth": 1e-5, "do_bg": False, "ddp": False}, {},
                          weight_ce=1, weight_dice=1, dice_class=MemoryEfficientSoftDiceLoss)
    loss.dc.apply_nonlin = softmax_helper_dim1
    if deep_supervision:
        loss = DeepSupervisionWrapper(loss, [2 / 3, 1 / 3, 0.0])
    return net, loss


class _Step:
    """The GI-LS mixin with just what its per-sample step needs (no nnU-Net trainer)."""

    def __init__(self, network, nnunet_loss, **attrs):
        from nnunet_dro.training.gils import FeaturePerturbation
        from nnunet_dro.training.losses import per_sample_loss_from_nnunet

        class Base:
            def _build_per_sample_loss(self, loss):
                return per_sample_loss_from_nnunet(loss)

        class Trainer(FeaturePerturbation, Base):
            pass

        Trainer.gils_settings = replace(FeaturePerturbation.gils_settings, **attrs)
        self.t = Trainer()
        self.t.network = network
        self.t.per_sample_loss = self.t._build_per_sample_loss(nnunet_loss)


def _batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, 16, 16, 16, generator=g)
    y = (torch.rand(2, 1, 16, 16, 16, generator=g) > 0.7).long()
    return x, [y, y[:, :, ::2, ::2, ::2], y[:, :, ::4, ::4, ::4]]


def test_step_loss_is_per_sample_and_its_gradient_reaches_the_body_through_the_perturbed_features():
    net, loss = _network_and_loss()
    x, ys = _batch()
    step = _Step(net, loss, clean_weight=0.0, steps=3)
    per_sample = step.t._forward_per_sample(x, ys)
    assert per_sample.shape == (2,)
    per_sample.sum().backward()
    encoder_grad = net.encoder.stages[0][0].convs[0].conv.weight.grad
    assert encoder_grad is not None and encoder_grad.abs().sum() > 0
    heads = net.decoder.seg_layers  # called lowest resolution first: [-1] gives nnU-Net's first output
    assert heads[-1].weight.grad.abs().sum() > 0 and heads[-2].weight.grad.abs().sum() > 0
    assert heads[0].weight.grad is None  # deep-supervision weight 0: no term, as in nnU-Net

    # the perturbed loss is the loss at head(z0 + delta), higher than at z0, and smoothed by alpha
    from nnunet_dro.training.nnunet_compat import captured_head_inputs
    net.zero_grad()
    with captured_head_inputs(net):  # the same forward as the step (heads hooked), no input kept
        outputs = net(x)
    clean = step.t.per_sample_loss(outputs, ys)
    with torch.no_grad():
        assert torch.all(per_sample > clean)
    assert step.t.per_sample_loss.loss.label_smoothing == pytest.approx(0.1)


def test_zero_steps_and_clean_weight_give_the_smoothed_loss_at_the_clean_features():
    net, loss = _network_and_loss()
    x, ys = _batch()
    for attrs in ({"steps": 0, "clean_weight": 0.0}, {"steps": 4, "clean_weight": 1.0}):
        step = _Step(net, loss, **attrs)
        got = step.t._forward_per_sample(x, ys)
        expected = step.t.per_sample_loss(net(x), ys)
        assert torch.allclose(got, expected, atol=1e-6)


def test_ce_ascent_moves_the_features_by_the_smoothed_ce_alone():
    """``ascent_dice=False``: the ascent's loss is the smoothed CE of each sample (the paper's loss);
    the step's loss at the perturbed features keeps nnU-Net's Dice."""
    net, loss = _network_and_loss()
    x, ys = _batch()
    ce_step, both_step = _Step(net, loss, ascent_dice=False), _Step(net, loss)
    out = net(x)[0]
    expected = F.cross_entropy(out, ys[0][:, 0], label_smoothing=0.1, reduction="none").flatten(1).mean(1)
    assert torch.allclose(ce_step.t._gils_ascent_loss(out, ys[0]), expected, atol=1e-6)
    assert both_step.t._gils_ascent_loss is both_step.t.per_sample_loss.loss  # CE + Dice
    assert ce_step.t.per_sample_loss.loss.weight_dice == 1  # the step's loss is nnU-Net's, smoothed
    # one step of the whole trainer step moves z0 by step_size * voxels * d CE / d z
    from nnunet_dro.training.nnunet_compat import captured_head_inputs
    with captured_head_inputs(net) as captured:
        net(x)
    head, z0 = captured[0]
    z = z0.detach().float().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(head(z), ys[0][:, 0], label_smoothing=0.1,
                                                  reduction="none").flatten(1).mean(1).sum(), z)
    delta = ascend_features(z0, head, lambda o: ce_step.t._gils_ascent_loss(o, ys[0]), 1, 1.5, 1e-3,
                            scale=float(z0[0, 0].numel()))
    assert torch.allclose(delta, 1.5 * z0[0, 0].numel() * grad, rtol=1e-4, atol=1e-6)
    step = _Step(net, loss, ascent_dice=False, clean_weight=0.0, steps=3)
    per_sample = step.t._forward_per_sample(x, ys)
    with torch.no_grad():
        assert per_sample.shape == (2,) and torch.all(per_sample > step.t.per_sample_loss(net(x), ys))


def test_ce_ascent_without_a_ce_term_is_refused_clearly():
    from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
    from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss
    from nnunetv2.utilities.helpers import softmax_helper_dim1

    net, _ = _network_and_loss(deep_supervision=False)
    dice_only = DC_and_CE_loss({"batch_dice": False, "smooth": 1e-5, "do_bg": False, "ddp": False}, {},
                               weight_ce=0, weight_dice=1, dice_class=MemoryEfficientSoftDiceLoss)
    dice_only.dc.apply_nonlin = softmax_helper_dim1
    with pytest.raises(RuntimeError, match="no CE term"):
        _Step(net, dice_only, ascent_dice=False)
    _Step(net, dice_only)  # the ascent on CE + Dice still has the Dice


def test_step_without_deep_supervision():
    net, loss = _network_and_loss(deep_supervision=False)
    x, ys = _batch()
    step = _Step(net, loss, clean_weight=0.5)
    per_sample = step.t._forward_per_sample(x, ys[0])
    assert per_sample.shape == (2,) and torch.isfinite(per_sample).all()


def test_region_configurations_are_refused_clearly():
    from nnunetv2.training.loss.compound_losses import DC_and_BCE_loss
    from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss

    net, _ = _network_and_loss()
    bce = DC_and_BCE_loss({}, {"batch_dice": False, "do_bg": True, "smooth": 1e-5, "ddp": False},
                          use_ignore_label=False, dice_class=MemoryEfficientSoftDiceLoss)
    with pytest.raises(RuntimeError, match="sigmoid BCE"):
        _Step(net, bce)


def test_trainers_attributes_defaults_and_variants():
    from test_train_trainer_dir import _check_keeps_nnunet_signature_and_sets_only_attributes

    import nnunet_dro.training as training

    base = training.nnUNetTrainerDROLS
    g = base.gils_settings
    assert (g.steps, g.step_size, g.gamma, g.alpha, g.clean_weight, g.ascent_dice) == (6, 1.5, 1e-3, 0.1, 0.5, True)
    from nnunet_dro.lab import variants

    assert variants.nnUNetTrainerDROLS_T1.gils_settings.steps == 1
    assert variants.nnUNetTrainerDROLS_ceAscent.gils_settings == replace(g, ascent_dice=False)
    for variant in (variants.nnUNetTrainerDROLS_T1, variants.nnUNetTrainerDROLS_ceAscent):
        _check_keeps_nnunet_signature_and_sets_only_attributes(variant, "nnUNetTrainerDROLS")
    with pytest.raises(ValueError, match="ascent_dice"):
        replace(g, ascent_dice=1)
    combo = training.nnUNetTrainerDROLS_DRO
    assert issubclass(combo, training.nnUNetTrainerDROAdaptive) and combo.gils_settings.steps == 6
    _check_keeps_nnunet_signature_and_sets_only_attributes(combo, "nnUNetTrainerDROLS")
    from nnunet_dro.lab.budget import BUDGET_TRAINERS

    for name in ("nnUNetTrainerDROLS", "nnUNetTrainerDROLS_T1", "nnUNetTrainerDROLS_ceAscent", "nnUNetTrainerDROLS_DRO"):
        # the product offers GI-LS on the default's sampling; GI-LS on uniform draws and its ablations are the lab's
        assert (name in training.__all__) == (name == "nnUNetTrainerDROLS_DRO") and name + "_CPUBudget" not in training.__all__
        assert name + "_CPUBudget" in BUDGET_TRAINERS  # the lab's twin, found through its own folder


# ------------------------------------------------------------------ end to end, nnU-Net's CLI
GILS_TEST_TRAINERS = '''
from dataclasses import replace

import torch

from nnunet_dro.lab.variants import nnUNetTrainerDROLS_T1
from nnunet_dro.training import nnUNetTrainerDROLS_DRO
from nnunet_dro.training.short_run import ShortRun


class GilsTestSize(ShortRun):
    short_epochs, short_iterations, short_val_iterations = 1, 2, 1

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.save_every = 1

    def perform_actual_validation(self, save_probabilities=False):
        self.print_to_log_file("e2e test: final validation skipped")


class nnUNetTrainerDROLS_e2eTest(GilsTestSize, nnUNetTrainerDROLS_T1):
    pass


class nnUNetTrainerDROLS_DRO_e2eTest(GilsTestSize, nnUNetTrainerDROLS_DRO):
    gils_settings = replace(nnUNetTrainerDROLS_DRO.gils_settings, steps=2)
'''


@pytest.fixture(scope="module")
def gils_runs(label_dataset, tmp_path_factory):
    """Each trainer: one epoch, then resumed with --c for a second (2 iterations an epoch)."""
    folder = tmp_path_factory.mktemp("ext_trainers_gils")
    (folder / "gils_test_trainers.py").write_text(textwrap.dedent(GILS_TEST_TRAINERS))
    ds = label_dataset
    runs = {}
    for trainer in ("nnUNetTrainerDROLS_e2eTest", "nnUNetTrainerDROLS_DRO_e2eTest"):
        env = {**ds.env, "nnUNet_extTrainer": os.pathsep.join([TRAINER_DIR, str(folder)]),
               "nnUNet_n_proc_DA": "0"}
        cmd = [BIN / "nnUNetv2_train", ds.dataset_id, "3d_fullres", 0, "-tr", trainer, "-device", "cpu"]
        run_cli(cmd, {**env, "nnUNet_dro_short_run": "1"})
        fold = ds.results / ds.folder_name / f"{trainer}__nnUNetPlans__3d_fullres" / "fold_0"
        first = torch.load(fold / "checkpoint_final.pth", map_location="cpu", weights_only=False)
        run_cli(cmd + ["--c"], {**env, "nnUNet_dro_short_run": "2"})
        runs[trainer] = (fold, first)
    return runs


def _logs(fold):
    return "\n".join(p.read_text() for p in sorted(fold.glob("training_log_*.txt")))


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["nnUNetTrainerDROLS_e2eTest", "nnUNetTrainerDROLS_DRO_e2eTest"])
def test_gils_trainers_train_and_resume_with_nnunet_cli(gils_runs, trainer):
    fold, first = gils_runs[trainer]
    final = torch.load(fold / "checkpoint_final.pth", map_location="cpu", weights_only=False)
    assert first["current_epoch"] == 1 and final["current_epoch"] == 2 and final["trainer_name"] == trainer
    log = _logs(fold)
    assert "GI-LS: " in log and "ascent step(s)" in log
    shifts = [float(l.split("finest scale ")[1].split(" ")[0]) for l in log.splitlines() if "feature shift" in l]
    assert len(shifts) == 2 and all(s > 0 for s in shifts)
    changed = [k for k, v in final["network_weights"].items() if not torch.equal(v, first["network_weights"][k])]
    assert any(k.startswith("encoder.") for k in changed)  # the resumed epoch trained the body
    if "DRO_" in trainer:
        assert "dro_state" in final and len(final["dro_state"]["history"]["epoch"]) == 2
        assert "DRO: restored the case-weighting state" in log
