"""``nnUNetTrainerDRO``: nnU-Net v2 training with hardness weighted sampling (Algorithm 1).

What changes compared with ``nnUNetTrainer`` (everything else is nnU-Net's):

- **Sampling.** One stale loss per training case of the fold (nnU-Net's split; sampler index
  ``i`` is the ``i``-th of the sorted training identifiers). The data-augmentation workers draw
  each batch i.i.d. with replacement from ``softmax(beta * L)`` out of shared memory
  (:class:`~nnunet_dro.training.dataloading.nnUNetDataLoaderDRO`); nnU-Net's foreground
  oversampling, cropping and augmentation are unchanged. The validation loader is nnU-Net's.
- **Loss.** The per-sample twin of nnU-Net's own loss (:mod:`nnunet_dro.training.losses`).
  The step minimises ``mean_i(w_i * l_i)`` with the clipped importance weights
  ``w_i = clip(exp(beta * (l_i - L_i)), w_min, w_max)`` (computed in log space, on the device,
  without a GPU sync), then ``L_i <- l_i``. nnU-Net's CUDA path is kept: autocast, GradScaler,
  gradient clipping at 12, compiled Dice.
- **State.** Stale losses, draw counts, the sampler's RNG state and the per-epoch statistics
  live in nnU-Net's checkpoint under ``'dro_state'``; ``--c`` restores them before the data
  loaders start.
- **DDP.** Ranks all-gather their (case, loss) pairs every iteration, so every rank holds the
  same loss vector; each rank draws from its own RNG stream; only rank 0 writes files.
- **Observability.** Each epoch the log shows the entropy of p, the effective sample size, max p,
  the fraction of clipped importance weights and the hardest cases; the fold folder gets
  ``dro_hardness.csv`` and ``dro_progress.png`` (:mod:`nnunet_dro.training.hardness_report`).

Hyper-parameters are class attributes (``dro_beta``, ``dro_importance_sampling``, ``dro_clip``,
...), so variants are one-line subclasses (:mod:`nnunet_dro.training.variants`) and user
subclasses in their own ``nnUNet_extTrainer`` folder work the same way::

    from nnunet_dro.training import nnUNetTrainerDRO

    class nnUNetTrainerDRO_beta30(nnUNetTrainerDRO):
        dro_beta = 30.0
"""
from __future__ import annotations

import contextlib
import math
from copy import deepcopy
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from batchgenerators.dataloading.nondet_multi_threaded_augmenter import NonDetMultiThreadedAugmenter
from batchgenerators.dataloading.single_threaded_augmenter import SingleThreadedAugmenter
from batchgenerators.utilities.file_and_folder_operations import join
from torch import autocast, nn

from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
from nnunetv2.training.dataloading.nnunet_dataset import infer_dataset_class
from nnunetv2.training.lr_scheduler.polylr import PolyLRScheduler
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from nnunetv2.utilities.default_n_proc_DA import get_allowed_n_proc_DA
from nnunetv2.utilities.helpers import dummy_context

from nnunet_dro.sampling import (HardnessWeightedSampler, all_gather_updates, kl_dro_objective)
from nnunet_dro.sampling.distributions import chi2_dro_objective
from nnunet_dro.training.dataloading import nnUNetDataLoaderDRO
from nnunet_dro.training.hardness_report import (HARDNESS_CSV, PROGRESS_PNG, hardness_table,
                                                 plot_dro_progress, write_hardness_csv)
from nnunet_dro.training.losses import per_sample_loss_from_nnunet, uses_batch_dice

#: Checkpoint key of the sampler state (stale losses, draw counts, RNG state, statistics).
DRO_STATE_KEY = "dro_state"
DRO_STATE_VERSION = 1
#: L_init: above any per-case value of nnU-Net's losses, so every case is drawn once early.
DEFAULT_INIT_LOSS = 100.0

HISTORY_KEYS = ("epoch", "entropy", "max_entropy", "effective_sample_size", "max_probability",
                "clipped_fraction", "num_weights", "robust_loss", "mean_stale_loss", "num_skipped", "hardest")


def importance_weights_torch(fresh: torch.Tensor, stale: torch.Tensor, beta: float,
                             clip: Tuple[float, float]) -> torch.Tensor:
    """``clip(exp(beta * (fresh - stale)), *clip)`` on the device, in log space (no overflow).

    The same numbers as :meth:`HardnessWeightedSampler.importance_weights` (float32 instead of
    float64); a non-finite fresh loss gets the neutral weight 1. No host synchronisation.

    >>> importance_weights_torch(torch.tensor([0.5, 10.0]), torch.tensor([0.5, 0.0]), 100.0, (0.1, 10.0))
    tensor([ 1., 10.])
    """
    log_w = (beta * (fresh.float() - stale.float())).clamp(math.log(clip[0]), math.log(clip[1]))
    return torch.where(torch.isfinite(fresh), torch.exp(log_w), torch.ones_like(log_w))


@contextlib.contextmanager
def _checkpoint_io_hook(extra_entries: Optional[Dict[str, Any]] = None,
                        captured: Optional[Dict[str, Any]] = None):
    """Add entries to, or capture, the checkpoint dict nnU-Net saves/loads inside the block.

    nnU-Net builds its checkpoint dict inside ``save_checkpoint`` and reads it inside
    ``load_checkpoint``. Wrapping ``torch.save``/``torch.load`` for the duration of those calls
    lets us add ``'dro_state'`` (and read it back) without copying nnU-Net's code and without
    writing or reading the file twice. Only dicts that look like nnU-Net checkpoints are touched;
    the originals are restored even on error.
    """
    original_save, original_load = torch.save, torch.load

    def save(obj, f, *args, **kwargs):
        if extra_entries and isinstance(obj, dict) and "network_weights" in obj:
            obj = {**obj, **extra_entries}
        return original_save(obj, f, *args, **kwargs)

    def load(*args, **kwargs):
        obj = original_load(*args, **kwargs)
        if captured is not None and isinstance(obj, dict) and "network_weights" in obj:
            captured["checkpoint"] = obj
        return obj

    torch.save, torch.load = save, load
    try:
        yield
    finally:
        torch.save, torch.load = original_save, original_load


class nnUNetTrainerConfigurableSGD(nnUNetTrainer):
    """nnU-Net's optimiser (SGD, lr 1e-2, weight decay 3e-5, poly schedule) with momentum and
    Nesterov as class attributes. With the defaults it is exactly ``nnUNetTrainer``."""

    sgd_momentum: float = 0.99
    sgd_nesterov: bool = True

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.network.parameters(), self.initial_lr, weight_decay=self.weight_decay,
                                    momentum=self.sgd_momentum, nesterov=self.sgd_nesterov and self.sgd_momentum > 0)
        lr_scheduler = PolyLRScheduler(optimizer, self.initial_lr, self.num_epochs)
        return optimizer, lr_scheduler


class nnUNetTrainerPerSampleLoss(nnUNetTrainerConfigurableSGD):
    """Base of the trainers that weight cases: ``self.per_sample_loss`` is the per-sample twin of
    nnU-Net's loss (shape ``(b,)``; nnU-Net's own ``self.loss`` is kept for validation), and
    :meth:`_optimizer_step` is nnU-Net's backward/step (GradScaler on CUDA, gradient clipping at 12)."""

    def _build_loss(self):
        loss = super()._build_loss()  # nnU-Net's loss: kept for validation and as the template
        self.per_sample_loss = self._build_per_sample_loss(loss)
        return loss

    def _build_per_sample_loss(self, nnunet_loss: nn.Module) -> nn.Module:
        """The per-sample twin of nnU-Net's loss; override for a custom loss (must return (b,))."""
        per_sample = per_sample_loss_from_nnunet(nnunet_loss).to(self.device)
        if self._do_i_compile():  # as nnU-Net compiles its Dice
            inner = per_sample.loss if hasattr(per_sample, "weight_factors") else per_sample
            inner.dc = torch.compile(inner.dc)
        if uses_batch_dice(nnunet_loss):
            self.print_to_log_file(
                "This configuration uses batch Dice, which cannot be split per case. The per-case "
                "losses that weight the cases (and drive any sampler) use per-sample Dice instead "
                "(validation loss unchanged).")
        return per_sample

    # ------------------------------------------------------------------ checkpoint state
    # Subclasses keep their own state (stale losses, running means...) under 'dro_state' in
    # nnU-Net's checkpoint: no side file, and --c restores it.
    def _extra_checkpoint_state(self) -> Optional[Dict[str, Any]]:
        """What to save under ``'dro_state'`` (None: nothing)."""
        return None

    def _restore_extra_checkpoint_state(self, state: Optional[Dict[str, Any]], checkpoint: Dict[str, Any]) -> None:
        """Called by :meth:`load_checkpoint` with the checkpoint's ``'dro_state'`` (None if absent)."""

    def save_checkpoint(self, filename: str) -> None:
        state = self._extra_checkpoint_state() if self.local_rank == 0 and not self.disable_checkpointing else None
        with _checkpoint_io_hook(extra_entries={DRO_STATE_KEY: state} if state is not None else None):
            super().save_checkpoint(filename)

    def load_checkpoint(self, filename_or_checkpoint: Union[dict, str]) -> None:
        captured: Dict[str, Any] = {}
        with _checkpoint_io_hook(captured=captured):
            super().load_checkpoint(filename_or_checkpoint)
        checkpoint = filename_or_checkpoint if isinstance(filename_or_checkpoint, dict) \
            else captured.get("checkpoint", {})
        self._restore_extra_checkpoint_state(checkpoint.get(DRO_STATE_KEY), checkpoint)

    def _to_device(self, batch: dict):
        data = batch['data'].to(self.device, non_blocking=True)
        target = batch['target']
        if isinstance(target, list):
            target = [i.to(self.device, non_blocking=True) for i in target]
        else:
            target = target.to(self.device, non_blocking=True)
        return data, target

    def _optimizer_step(self, l: torch.Tensor) -> None:
        """nnU-Net's backward and optimiser step for the loss ``l`` (gradients already zeroed)."""
        if self.grad_scaler is not None:
            self.grad_scaler.scale(l).backward()
            self.grad_scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            l.backward()
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
            self.optimizer.step()


class nnUNetTrainerDRO(nnUNetTrainerPerSampleLoss):
    """nnU-Net training with hardness weighted sampling: the paper's setting (beta 100, importance
    sampling, weights clipped to [0.1, 10]). See the module docstring for what changes.

    Class attributes (set them in a subclass):

    - ``dro_beta``: inverse temperature of ``p = softmax(beta * L)``; ``beta -> 0`` is ERM.
    - ``dro_divergence``: ``"kl"`` (Algorithm 1) or ``"chi2"`` (paper 001's Pearson chi-square
      rule ``p_i = max(0, 1 + beta (L_i - lam)) / n``, see
      :class:`~nnunet_dro.sampling.HardnessWeightedSampler`).
    - ``dro_warmup``: start with a uniform pass that gives every case a fresh loss before the
      hardness sampling starts (importance weights are 1 during it).
    - ``dro_importance_sampling`` / ``dro_clip``: the clipped importance weights.
    - ``dro_init_loss``: initial stale loss ``L_init`` of Algorithm 1, "the largest plausible
      loss": ``None`` = 100, far above any per-case Dice + CE/BCE value of nnU-Net (an untrained
      network gives about 1-3), so the first draws sweep the cases not yet seen before hardness
      takes over (a lower value such as ln(number of classes) lets the first cases drawn, whose
      untrained losses exceed it, take all the probability at beta = 100).
    - ``dro_seed``: base seed of the draws (rank ``r`` uses ``seed + r``); ``None`` = fresh entropy.
    - ``dro_num_hardest_logged``: how many hardest cases the log lists each epoch.
    - ``dro_write_report_every_epoch``: refresh ``dro_hardness.csv``/``dro_progress.png`` each epoch
      (otherwise only at the end of training).
    """

    dro_beta: float = 100.0
    dro_divergence: str = "kl"
    dro_warmup: bool = False
    dro_importance_sampling: bool = True
    dro_clip: Tuple[float, float] = (0.1, 10.0)
    dro_init_loss: Optional[float] = None
    dro_seed: Optional[int] = None
    dro_num_hardest_logged: int = 5
    dro_write_report_every_epoch: bool = True

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.dro_sampler: Optional[HardnessWeightedSampler] = None
        self.dro_case_ids: Optional[List[str]] = None
        self._dro_index_of: Dict[str, int] = {}
        self.per_sample_loss: Optional[nn.Module] = None
        # state read by load_checkpoint before the sampler exists (nnU-Net loads --c checkpoints
        # before on_train_start); applied when the sampler is created, before the workers fork
        self._dro_pending_state: Optional[Dict[str, Any]] = None
        self._dro_history: Dict[str, list] = {k: [] for k in HISTORY_KEYS}
        self._dro_epoch_num_weights = 0
        self._dro_epoch_num_clipped = 0

    # ------------------------------------------------------------------ set-up
    def initialize(self):
        super().initialize()
        self.print_to_log_file(
            f"DRO: hardness weighted sampling ({self.dro_divergence} divergence"
            + (", uniform warm-up pass first" if self.dro_warmup else "")
            + f") with beta={self.dro_beta}, importance sampling="
            f"{'on' if self.dro_importance_sampling else 'off'}"
            + (f" (weights clipped to [{self.dro_clip[0]}, {self.dro_clip[1]}])" if self.dro_importance_sampling else "")
            + f", SGD momentum={self.sgd_momentum}, nesterov={self.sgd_nesterov and self.sgd_momentum > 0}")

    def _default_init_loss(self) -> float:
        return DEFAULT_INIT_LOSS

    def _create_sampler(self, case_ids: Sequence[str]) -> None:
        """Create the shared sampler over the fold's training cases; apply a checkpoint's state."""
        self._close_sampler()
        self.dro_case_ids = sorted(str(c) for c in case_ids)
        self._dro_index_of = {c: i for i, c in enumerate(self.dro_case_ids)}
        seed = None if self.dro_seed is None else int(self.dro_seed) + self.local_rank
        init = self._default_init_loss() if self.dro_init_loss is None else float(self.dro_init_loss)
        self.dro_sampler = HardnessWeightedSampler(
            len(self.dro_case_ids), beta=self.dro_beta, init_loss=init,
            importance_sampling=self.dro_importance_sampling, clip=tuple(self.dro_clip), seed=seed, shared=True,
            divergence=self.dro_divergence, warmup=self.dro_warmup)
        if self._dro_pending_state is not None:
            self._apply_dro_state(self._dro_pending_state)
            self._dro_pending_state = None
        self.print_to_log_file(f"DRO: sampling from {len(self.dro_case_ids)} training cases")

    def _close_sampler(self) -> None:
        if self.dro_sampler is not None:
            self.dro_sampler.close()
            self.dro_sampler = None

    def get_dataloaders(self):
        """nnU-Net's ``get_dataloaders`` with the training loader drawing from the DRO sampler."""
        if self.dataset_class is None:
            self.dataset_class = infer_dataset_class(self.preprocessed_dataset_folder)
        patch_size = self.configuration_manager.patch_size
        deep_supervision_scales = self._get_deep_supervision_scales()
        (rotation_for_DA, do_dummy_2d_data_aug, initial_patch_size, mirror_axes) = \
            self.configure_rotation_dummyDA_mirroring_and_inital_patch_size()
        regions = self.label_manager.foreground_regions if self.label_manager.has_regions else None
        tr_transforms = self.get_training_transforms(
            patch_size, rotation_for_DA, deep_supervision_scales, mirror_axes, do_dummy_2d_data_aug,
            use_mask_for_norm=self.configuration_manager.use_mask_for_norm,
            is_cascaded=self.is_cascaded, foreground_labels=self.label_manager.foreground_labels,
            regions=regions, ignore_label=self.label_manager.ignore_label)
        val_transforms = self.get_validation_transforms(
            deep_supervision_scales, is_cascaded=self.is_cascaded,
            foreground_labels=self.label_manager.foreground_labels, regions=regions,
            ignore_label=self.label_manager.ignore_label)

        dataset_tr, dataset_val = self.get_tr_and_val_datasets()
        # the sampler (shared memory) must exist before the workers fork
        self._create_sampler(dataset_tr.identifiers)
        dl_tr = nnUNetDataLoaderDRO(dataset_tr, self.batch_size, initial_patch_size,
                                    self.configuration_manager.patch_size, self.label_manager,
                                    case_ids=self.dro_case_ids, sampler=self.dro_sampler,
                                    oversample_foreground_percent=self.oversample_foreground_percent,
                                    pad_sides=None, transforms=tr_transforms,
                                    probabilistic_oversampling=self.probabilistic_oversampling)
        dl_val = nnUNetDataLoader(dataset_val, self.batch_size, self.configuration_manager.patch_size,
                                  self.configuration_manager.patch_size, self.label_manager,
                                  oversample_foreground_percent=self.oversample_foreground_percent,
                                  sampling_probabilities=None, pad_sides=None, transforms=val_transforms,
                                  probabilistic_oversampling=self.probabilistic_oversampling)

        allowed_num_processes = get_allowed_n_proc_DA()
        if allowed_num_processes == 0:
            mt_gen_train = SingleThreadedAugmenter(dl_tr, None)
            mt_gen_val = SingleThreadedAugmenter(dl_val, None)
        else:
            mt_gen_train = NonDetMultiThreadedAugmenter(data_loader=dl_tr, transform=None,
                                                        num_processes=allowed_num_processes,
                                                        num_cached=max(6, allowed_num_processes // 2), seeds=None,
                                                        pin_memory=self.device.type == 'cuda', wait_time=0.002)
            mt_gen_val = NonDetMultiThreadedAugmenter(data_loader=dl_val, transform=None,
                                                      num_processes=max(1, allowed_num_processes // 2),
                                                      num_cached=max(3, allowed_num_processes // 4), seeds=None,
                                                      pin_memory=self.device.type == 'cuda', wait_time=0.002)
        # let's get this party started (as nnU-Net does). The first training batch is drawn but
        # not trained on, so it does not update the sampler.
        _ = next(mt_gen_train)
        _ = next(mt_gen_val)
        return mt_gen_train, mt_gen_val

    # ------------------------------------------------------------------ training step
    def on_train_epoch_start(self):
        super().on_train_epoch_start()
        self._dro_epoch_num_weights = 0
        self._dro_epoch_num_clipped = 0

    def _batch_indices(self, keys) -> np.ndarray:
        try:
            return np.fromiter((self._dro_index_of[str(k)] for k in keys), dtype=np.int64, count=len(keys))
        except KeyError as e:
            raise RuntimeError(f"DRO: the training batch contains case {e} that is not a training case of "
                               f"fold {self.fold}") from None

    def train_step(self, batch: dict) -> dict:
        indices = self._batch_indices(batch['keys'])
        # stale losses of the drawn cases: a tiny host->device copy, queued before the forward pass
        stale = torch.from_numpy(self.dro_sampler.losses[indices].astype(np.float32))
        data, target = self._to_device(batch)
        stale = stale.to(self.device, non_blocking=True)

        self.optimizer.zero_grad(set_to_none=True)
        # autocast only on CUDA, as in nnU-Net
        with autocast(self.device.type, enabled=True) if self.device.type == 'cuda' else dummy_context():
            output = self.network(data)
            per_sample = self.per_sample_loss(output, target)
            if self.dro_importance_sampling:
                weights = self._importance_weights(per_sample.detach(), stale, indices)
                l = (weights * per_sample).mean()
            else:
                l = per_sample.mean()
        self._optimizer_step(l)

        # the one device->host transfer of the step (nnU-Net does the same for its scalar loss)
        fresh = per_sample.detach().cpu().numpy().astype(np.float64)
        self._update_sampler(indices, fresh)
        # report the unweighted mean so that train_loss stays comparable with nnU-Net's
        return {'loss': np.array(fresh.mean())}

    def _importance_weights(self, fresh: torch.Tensor, stale: torch.Tensor, indices: np.ndarray) -> torch.Tensor:
        """Importance weights of the batch: 1 during the warm-up pass; for KL on the device without
        a host sync; for chi2 from the sampler (its weights need the threshold; one small sync)."""
        if self.dro_sampler.in_warmup:
            return torch.ones_like(fresh)
        if self.dro_divergence == "kl":
            return importance_weights_torch(fresh, stale, self.dro_beta, self.dro_clip)
        w = self.dro_sampler.importance_weights(indices, fresh.float().cpu().numpy().astype(np.float64))
        return torch.from_numpy(w.astype(np.float32)).to(fresh.device)

    def _update_sampler(self, indices: np.ndarray, fresh: np.ndarray) -> None:
        """Gather the (case, loss) pairs of all ranks, count clipped weights, then ``L_i <- l_i``."""
        all_indices, all_fresh = all_gather_updates(indices, fresh) if self.is_ddp else (indices, fresh)
        if self.dro_importance_sampling and (self.dro_sampler.in_warmup or self.dro_divergence != "kl"):
            # weights 1 during the warm-up (never clipped); chi2: count the sampler's clipped ratios
            finite = np.isfinite(all_fresh)
            if not self.dro_sampler.in_warmup:
                w = self.dro_sampler.importance_weights(all_indices[finite], all_fresh[finite])
                self._dro_epoch_num_clipped += int(np.count_nonzero((w <= self.dro_clip[0]) | (w >= self.dro_clip[1])))
            self._dro_epoch_num_weights += int(finite.sum())
        elif self.dro_importance_sampling:
            finite = np.isfinite(all_fresh)
            with np.errstate(invalid="ignore"):
                log_w = self.dro_beta * (all_fresh[finite] - self.dro_sampler.losses[all_indices[finite]])
            self._dro_epoch_num_clipped += int(np.count_nonzero(
                (log_w <= math.log(self.dro_clip[0])) | (log_w >= math.log(self.dro_clip[1]))))
            self._dro_epoch_num_weights += int(finite.sum())
        self.dro_sampler.update(all_indices, all_fresh)

    # ------------------------------------------------------------------ per-epoch statistics
    def on_train_epoch_end(self, train_outputs: List[dict]):
        super().on_train_epoch_end(train_outputs)
        self._record_and_log_dro_statistics()

    def _record_and_log_dro_statistics(self) -> None:
        s = self.dro_sampler
        stats = s.stats(k=self.dro_num_hardest_logged)
        if self.dro_importance_sampling and self._dro_epoch_num_weights > 0:
            clipped = self._dro_epoch_num_clipped / self._dro_epoch_num_weights
        else:
            clipped = float('nan')
        hardest = [(self.dro_case_ids[i], loss) for i, loss in stats["hardest"]]
        record = {
            "epoch": int(self.current_epoch),
            "entropy": stats["entropy"],
            "max_entropy": stats["max_entropy"],
            "effective_sample_size": stats["effective_sample_size"],
            "max_probability": stats["max_probability"],
            "clipped_fraction": clipped,
            "num_weights": int(self._dro_epoch_num_weights),
            "robust_loss": (chi2_dro_objective if self.dro_divergence == "chi2" else kl_dro_objective)(
                s.losses, self.dro_beta),
            "mean_stale_loss": float(np.mean(s.losses)),
            "num_skipped": int(stats["num_skipped"]),
            "hardest": hardest,
        }
        # a resumed run may repeat an epoch that a later checkpoint had recorded
        while self._dro_history["epoch"] and self._dro_history["epoch"][-1] >= record["epoch"]:
            for k in HISTORY_KEYS:
                self._dro_history[k].pop()
        for k in HISTORY_KEYS:
            self._dro_history[k].append(record[k])

        n = len(self.dro_case_ids)
        clipped_text = (f"{100 * clipped:.1f}% of {self._dro_epoch_num_weights}"
                        if self.dro_importance_sampling else "n/a (importance sampling off)")
        self.print_to_log_file(
            f"DRO: entropy of p {record['entropy']:.4f} (uniform {record['max_entropy']:.4f}), effective sample "
            f"size {record['effective_sample_size']:.2f} of {n}, max p {record['max_probability']:.4f}, "
            f"clipped importance weights {clipped_text}, robust loss {record['robust_loss']:.4f}, "
            f"mean stale loss {record['mean_stale_loss']:.4f}"
            + (f", skipped non-finite losses {record['num_skipped']}" if record['num_skipped'] else ""))
        self.print_to_log_file("DRO: hardest cases: " + ", ".join(f"{c} ({v:.4f})" for c, v in hardest))

    def on_epoch_end(self):
        super().on_epoch_end()
        if self.dro_write_report_every_epoch:
            self.write_hardness_report()

    def on_train_end(self):
        super().on_train_end()  # saves checkpoint_final.pth (with dro_state), stops the workers
        self.write_hardness_report()
        if self.dro_sampler is not None:
            # keep the final state for any later save_checkpoint; release the shared memory
            self._dro_pending_state = self._dro_state()
            self._close_sampler()

    def write_hardness_report(self) -> None:
        """Write ``dro_hardness.csv`` and ``dro_progress.png`` to the fold folder (rank 0 only)."""
        if self.local_rank != 0 or self.dro_sampler is None:
            return
        s = self.dro_sampler
        table = hardness_table(self.dro_case_ids, np.array(s.losses), s.probabilities(), np.array(s.draw_counts))
        write_hardness_csv(join(self.output_folder, HARDNESS_CSV), table)
        plot_dro_progress(join(self.output_folder, PROGRESS_PNG), self._dro_history, len(self.dro_case_ids))

    # ------------------------------------------------------------------ checkpoint
    def _dro_state(self) -> Optional[Dict[str, Any]]:
        if self.dro_sampler is None:
            return self._dro_pending_state
        return {
            "version": DRO_STATE_VERSION,
            "case_ids": list(self.dro_case_ids),
            "sampler": self.dro_sampler.state_dict(),
            "history": deepcopy(self._dro_history),
            "config": {"beta": self.dro_beta, "importance_sampling": self.dro_importance_sampling,
                       "clip": tuple(self.dro_clip), "divergence": self.dro_divergence, "warmup": self.dro_warmup},
        }

    def _extra_checkpoint_state(self) -> Optional[Dict[str, Any]]:
        return self._dro_state()

    def _restore_extra_checkpoint_state(self, state: Optional[Dict[str, Any]], checkpoint: Dict[str, Any]) -> None:
        if state is None:
            self.print_to_log_file("DRO: WARNING: the checkpoint has no 'dro_state' (not a DRO training?); "
                                   "the stale losses start from scratch")
            return
        state = self._trim_history(state, int(checkpoint.get("current_epoch", 0)))
        if self.dro_sampler is not None:
            self._apply_dro_state(state)
        else:
            self._dro_pending_state = state

    @staticmethod
    def _trim_history(state: Dict[str, Any], next_epoch: int) -> Dict[str, Any]:
        """Drop statistics of epochs the resumed run will redo (e.g. from a 'best' checkpoint)."""
        history = state.get("history") or {}
        keep = [i for i, e in enumerate(history.get("epoch", [])) if e < next_epoch]
        state = dict(state)
        state["history"] = {k: [history[k][i] for i in keep] if k in history else [] for k in HISTORY_KEYS}
        return state

    def _apply_dro_state(self, state: Dict[str, Any]) -> None:
        if list(state["case_ids"]) != list(self.dro_case_ids):
            raise RuntimeError(
                f"DRO: the checkpoint's sampler state is for {len(state['case_ids'])} training cases that differ "
                f"from the {len(self.dro_case_ids)} training cases of fold {self.fold} now (was splits_final.json "
                f"changed?). Resume with the original split or start a new training.")
        self.dro_sampler.load_state_dict(state["sampler"])
        self._dro_history = {k: list(state.get("history", {}).get(k, [])) for k in HISTORY_KEYS}
        self.print_to_log_file(f"DRO: restored the stale losses and draw counts of {len(self.dro_case_ids)} "
                               f"cases from the checkpoint")
