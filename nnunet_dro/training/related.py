"""Related robust-training methods as nnU-Net trainers, beside hardness weighted sampling
(docs/methods.md), so that they can be compared on equal terms.

| trainer                          | method                                            | paper | sampling             |
|----------------------------------|---------------------------------------------------|-------|----------------------|
| nnUNetTrainerDROChi2             | chi-square DRO sampling, uniform warm-up epoch    | 001   | hardness (chi2)      |
| nnUNetTrainerDROReweight         | KL-DRO by multiplicative per-case weights         | 004   | uniform (nnU-Net's)  |
| nnUNetTrainerL2RW                | learning to reweight (one-step look-ahead)        | 003   | uniform (nnU-Net's)  |

All of them keep nnU-Net's plans, network, augmentation, foreground oversampling, validation and
inference, and use the per-sample twin of nnU-Net's loss (:mod:`nnunet_dro.training.losses`).
Their ablations (chi-square without its warm-up pass, ``nnUNetTrainerDRO`` with one) are the lab's
(:mod:`nnunet_dro.lab.variants`).
The case weighting is the class attribute ``dro_settings`` (:mod:`nnunet_dro.weighting.settings`),
so variants are one-line subclasses::

    from dataclasses import replace
    from nnunet_dro.training import nnUNetTrainerDROReweight

    class nnUNetTrainerDROReweight_mild(nnUNetTrainerDROReweight):
        dro_settings = replace(nnUNetTrainerDROReweight.dro_settings, schedule=((0.0, 1.0), (0.5, 0.1)))
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch
from batchgenerators.dataloading.single_threaded_augmenter import SingleThreadedAugmenter
from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
from nnunetv2.utilities.helpers import dummy_context
from torch import autocast

from nnunet_dro.training.trainer import nnUNetTrainerCaseWeighting, nnUNetTrainerDRO, nnUNetTrainerPerSampleLoss
from nnunet_dro.weighting.learning_to_reweight import learning_to_reweight
from nnunet_dro.weighting.settings import Chi2HardnessSettings, ImportanceSettings, KLReweightSettings


# ------------------------------------------------------------ Fidon et al. 2020: chi-square DRO
class nnUNetTrainerDROChi2(nnUNetTrainerDRO):
    """Hardness weighted sampling for the Pearson chi-square DRO problem (Fidon et al. 2020):
    ``p_i = max(0, 1 + beta (L_i - lam)) / n`` with the threshold ``lam`` solved exactly, importance
    sampling off (as in Fidon et al. 2020), and a uniform warm-up pass that gives every training case a
    fresh loss before the hardness sampling starts.

    Why ``beta = 10``: when no case is clipped, ``n p_i = 1 + beta (L_i - mean(L))``, so beta is
    directly "relative change of a case's probability per unit of loss above the mean". nnU-Net's
    Dice+CE per case spreads over about 0.05-0.3, i.e. cases sit within about +-0.15 of the mean:
    with beta = 10 the hardest cases are drawn about 2.5 times as often as under uniform sampling
    and cases more than 0.1 below the mean not at all (their probability is clipped to 0, which is
    how chi2 DRO ignores easy cases). beta = 100 (the KL default) would give ``n p_i`` up to 16
    and clip most cases to 0; beta = 1 stays within +-15% of uniform, i.e. about ERM.
    """

    dro_settings = Chi2HardnessSettings(beta=10.0, importance=ImportanceSettings(enabled=False), warmup=True)


# ---------------------------------------------- Sow et al., arXiv:2308.00311: KL reweighting
class nnUNetTrainerDROReweight(nnUNetTrainerCaseWeighting):
    """KL-DRO by weighting instead of sampling (Sow et al., arXiv:2308.00311): nnU-Net's uniform loader, and the step
    minimises ``mean_i(w_i * l_i)`` with ``w_i = exp(l_i / r) / u`` (:class:`~nnunet_dro.weighting.KLReweighting`), where
    ``u`` is a running mean over batches of ``exp(l / r)`` (log space) and ``r = 1 / beta`` follows
    ``dro_settings.schedule`` over training (progress = ``current_epoch / num_epochs``).

    Why the schedule ``r = 1 -> 0.1 -> 0.03`` (thirds of training) instead of the paper's
    ``10 -> 1 -> 0.1``: the paper's values are for cross-entropy on classification, whose
    per-example losses spread over several units; nnU-Net's Dice+CE per case spreads over about
    0.05-0.3, ten times less, so the first two stages are divided by ten (first third: weights
    within ``exp(0.3 / 1) = 1.35`` of each other, a near-uniform start; second: up to ``exp(3)``).
    The last stage stops at 0.03 (beta about 33) rather than 0.01 (beta 100, the sampler's
    default): the weights are not clipped (as in the paper), and at ``r = 0.01`` a case 0.2 above
    the running mean would get ``exp(20)`` and one case would drive the step (nnU-Net's gradient
    clipping at 12 bounds its size, not its direction); at 0.03 the same gap gives ``exp(6.7)``.

    Momentum 0.5 (``u <- 0.5 u + 0.5 mean_batch(exp(l / r))``), the low end of Sow et al.'s
    convergence range and the core's default: with 0.1 one loss spike keeps ``u`` so high that
    every weight stays near 0 for a long time (seen in the digits experiment).

    The state ``(log_u, r)`` and the latest loss of every case are saved in nnU-Net's checkpoint
    under ``'dro_state'`` and restored by ``--c``; ``dro_hardness.csv`` lists the cases by their
    latest loss. ``train_loss`` in the log is the unweighted mean, comparable with nnU-Net's.
    """

    dro_settings = KLReweightSettings(schedule=((0.0, 1.0), (1 / 3, 0.1), (2 / 3, 0.03)), momentum=0.5, clip=None)


# ---------------------------------------- Ren et al., arXiv:1803.09050: learning to reweight
def choose_validation_cases(training_cases: Sequence[str], fraction: float, minimum: int, seed: int) -> List[str]:
    """The clean validation subset of L2RW: ``max(minimum, round(fraction * n))`` of the fold's
    training cases (at most n), drawn without replacement with a fixed seed from the sorted ids,
    so that the same split always gives the same subset (also after ``--c``).

    >>> choose_validation_cases(["c", "a", "b"], fraction=0.1, minimum=2, seed=0) == \\
    ...     choose_validation_cases(["a", "b", "c"], fraction=0.1, minimum=2, seed=0)
    True
    >>> len(choose_validation_cases([f"case{i}" for i in range(100)], 0.1, 2, 0))
    10
    """
    cases = sorted(str(c) for c in training_cases)
    if not cases:
        raise ValueError("L2RW needs at least one training case")
    k = min(len(cases), max(int(minimum), int(round(fraction * len(cases)))))
    chosen = np.random.default_rng(seed).choice(len(cases), size=k, replace=False)
    return sorted(cases[i] for i in chosen)


class nnUNetTrainerL2RW(nnUNetTrainerPerSampleLoss):
    """Learning to reweight (Ren et al., arXiv:1803.09050): nnU-Net's uniform loader; for every training batch the
    case weights come from a one-step look-ahead and the gradient of the loss on a small clean
    validation batch (:func:`~nnunet_dro.weighting.learning_to_reweight.learning_to_reweight`,
    ``w_i = max(0, -dL_val/d eps_i)`` normalised to sum 1, or all 0), then the step minimises
    ``sum_i(w_i * l_i)``.

    The clean validation subset: ``l2rw_val_fraction`` (10%) of the fold's training cases, at
    least ``l2rw_val_min_cases`` (2), chosen with the fixed seed ``l2rw_val_seed`` from the sorted
    training identifiers (:func:`choose_validation_cases`). The chosen cases stay training cases
    (nnU-Net has no separate clean set; the paper's is clean by construction, ours is clean in the
    sense of "no augmentation"). Each iteration draws one batch of ``batch_size`` patches from
    them with a second nnU-Net loader in the main process: nnU-Net's random crops and foreground
    oversampling, nnU-Net's validation transforms (no augmentation). nnU-Net's own validation
    cases are never used for training decisions.

    The look-ahead step size is nnU-Net's initial learning rate (at eps = 0 the normalised weights
    do not depend on it, only its sign matters). The weights are computed in float32 without
    autocast; the step itself is nnU-Net's (autocast and GradScaler on CUDA). Cost: about 4.5
    plain steps per iteration on CPU (paper: ~3), measured with
    ``scripts/benchmark_overhead.py --trainers nnUNetTrainerL2RW``: the double backward through a
    3D U-Net costs more than a plain backward, and the step repeats the forward pass.
    """

    l2rw_val_fraction: float = 0.1
    l2rw_val_min_cases: int = 2
    l2rw_val_seed: int = 12345

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        if self.is_ddp:
            # each rank would normalise its weights over its own part of the batch and against its own
            # clean batch: not the global batch's weights of one look-ahead step
            raise RuntimeError(f"{type(self).__name__} does not run under DDP (nnUNetv2_train -num_gpus > 1): its "
                               f"weights would be normalised per GPU, not over the global batch; train it on one GPU")
        self.l2rw_val_cases: List[str] = []
        self.l2rw_val_loader = None
        self._l2rw_epoch_zero_batches = 0
        self._l2rw_epoch_zero_weights = 0
        self._l2rw_epoch_weights = 0
        self._l2rw_epoch_batches = 0

    def get_dataloaders(self):
        loaders = super().get_dataloaders()
        self.l2rw_val_loader = self._build_clean_validation_loader()
        return loaders

    def _build_clean_validation_loader(self):
        tr_keys, _ = self.do_split()
        self.l2rw_val_cases = choose_validation_cases(tr_keys, self.l2rw_val_fraction, self.l2rw_val_min_cases,
                                                      self.l2rw_val_seed)
        dataset = self.dataset_class(self.preprocessed_dataset_folder, self.l2rw_val_cases,
                                     folder_with_segs_from_previous_stage=self.folder_with_segs_from_previous_stage)
        regions = self.label_manager.foreground_regions if self.label_manager.has_regions else None
        transforms = self.get_validation_transforms(
            self._get_deep_supervision_scales(), is_cascaded=self.is_cascaded,
            foreground_labels=self.label_manager.foreground_labels, regions=regions,
            ignore_label=self.label_manager.ignore_label)
        patch_size = self.configuration_manager.patch_size
        loader = nnUNetDataLoader(dataset, self.batch_size, patch_size, patch_size, self.label_manager,
                                  oversample_foreground_percent=self.oversample_foreground_percent,
                                  sampling_probabilities=None, pad_sides=None, transforms=transforms,
                                  probabilistic_oversampling=self.probabilistic_oversampling)
        self.print_to_log_file(f"L2RW: clean validation batches from {len(self.l2rw_val_cases)} training cases "
                               f"(seed {self.l2rw_val_seed}): {', '.join(self.l2rw_val_cases)}")
        return SingleThreadedAugmenter(loader, None)

    def _functional_network(self) -> torch.nn.Module:
        """The plain module (no DDP wrapper, no torch.compile wrapper) for torch.func."""
        network = self.network.module if self.is_ddp else self.network
        return getattr(network, "_orig_mod", network)

    def on_train_epoch_start(self):
        super().on_train_epoch_start()
        self._l2rw_epoch_zero_batches = self._l2rw_epoch_zero_weights = 0
        self._l2rw_epoch_weights = self._l2rw_epoch_batches = 0

    def train_step(self, batch: dict) -> dict:
        data, target = self._to_device(batch)
        val_data, val_target = self._to_device(next(self.l2rw_val_loader))
        network = self._functional_network()
        weights = learning_to_reweight(network, self.per_sample_loss, data, target,
                                       val_data, val_target, inner_lr=float(self.initial_lr))
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device.type, enabled=True) if self.device.type == 'cuda' else dummy_context():
            output = self.network(data)
            per_sample = self.per_sample_loss(output, target)
            l = (weights.to(per_sample.dtype) * per_sample).sum()
        self._optimizer_step(l)
        w = weights.cpu().numpy()
        self._l2rw_epoch_batches += 1
        self._l2rw_epoch_zero_batches += int(not np.any(w > 0))
        self._l2rw_epoch_zero_weights += int(np.count_nonzero(w == 0))
        self._l2rw_epoch_weights += w.size
        return {'loss': np.array(per_sample.detach().float().mean().cpu().numpy())}

    def on_train_epoch_end(self, train_outputs: List[dict]):
        super().on_train_epoch_end(train_outputs)
        if self._l2rw_epoch_batches:
            self.print_to_log_file(
                f"L2RW: {self._l2rw_epoch_zero_weights} of {self._l2rw_epoch_weights} cases got weight 0, "
                f"{self._l2rw_epoch_zero_batches} of {self._l2rw_epoch_batches} batches skipped (all weights 0)")

    def on_train_end(self):
        super().on_train_end()
        if self.l2rw_val_loader is not None:
            self.l2rw_val_loader = None
