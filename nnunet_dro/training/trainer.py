"""The trainers that draw or weight cases by their loss: ``nnUNetTrainerDRO`` (Algorithm 1, the
paper's setting), ``nnUNetTrainerDROAdaptive`` (scale-free beta) and their common base
``nnUNetTrainerCaseWeighting``, which holds one :class:`~nnunet_dro.weighting.CaseWeighting`.

What changes compared with ``nnUNetTrainer`` (everything else is nnU-Net's):

- **Sampling.** One stale loss per training case of the fold (nnU-Net's split; index ``i`` is the
  ``i``-th of the sorted training identifiers). The data-augmentation workers draw each batch
  i.i.d. with replacement from the scheme's distribution out of shared memory
  (:class:`~nnunet_dro.training.dataloading.nnUNetDataLoaderDRO`; the batch carries the beta it
  was drawn with); nnU-Net's foreground oversampling, cropping and augmentation are unchanged.
  Schemes with uniform draws keep nnU-Net's loaders. The validation loader is nnU-Net's.
- **Loss.** The per-sample twin of nnU-Net's own loss (:mod:`nnunet_dro.training.losses`). One
  training step for every scheme: ``w = weights(idx, l, draw_beta)``, step on ``mean_i(w_i l_i)``,
  then ``update`` (``L_i <- l_i``, a new beta for the adaptive scheme). The weights need the b
  fresh losses on the host (one small device-to-host copy). nnU-Net's CUDA path is kept:
  autocast, GradScaler, gradient clipping at 12, compiled Dice.
- **State.** The case weighting is built at the end of ``initialize()``; its state (stale losses,
  draw counts, RNG state, beta, running mean of the weights) and the per-epoch statistics live in
  nnU-Net's checkpoint under ``'dro_state'``, so ``--c`` (applied right after initialisation)
  restores them before the data loaders start.
- **DDP.** Every rank starts from rank 0's state (broadcast at the end of ``initialize()``: the
  tie-breaking noise of ``L_init`` would otherwise differ), and ranks all-gather their (case, loss,
  draw beta) triples every iteration, so every rank holds the same state; each rank draws from its
  own RNG stream, saved per rank in the checkpoint and given back to that rank by ``--c``; only
  rank 0 writes files.
- **Observability.** Each epoch the log shows beta, the perplexity and effective sample size of
  p, max p, the fraction of clipped importance weights, the hardest cases and the stability count
  (:mod:`nnunet_dro.training.stability`); the fold folder gets ``dro_hardness.csv`` and
  ``dro_progress.png`` (:mod:`nnunet_dro.training.hardness_report`).

The case weighting is one class attribute, ``dro_settings`` (a frozen dataclass of
:mod:`nnunet_dro.weighting.settings`; its type is the scheme), so variants are one-line
subclasses (:mod:`nnunet_dro.training.variants`) and user subclasses in their own
``nnUNet_extTrainer`` folder work the same way::

    from dataclasses import replace
    from nnunet_dro.training import nnUNetTrainerDROAdaptive

    class nnUNetTrainerDROAdaptive_f60(nnUNetTrainerDROAdaptive):
        dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, fraction=0.6)
"""
from __future__ import annotations

import math
import os
from copy import deepcopy
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from batchgenerators.utilities.file_and_folder_operations import join
from nnunetv2.paths import nnUNet_raw
from nnunetv2.training.lr_scheduler.polylr import PolyLRScheduler
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from nnunetv2.utilities.helpers import dummy_context
from torch import autocast, nn

from nnunet_dro.sampling import all_gather_updates
from nnunet_dro.training.case_tables import (
    CASE_WEIGHTS_ENV,
    CASE_WEIGHTS_FILENAME,
    GROUP_COLUMN_ENV,
    SUBGROUPS_ENV,
    SUBGROUPS_FILENAME,
    find_case_table,
    read_case_groups,
    read_case_weights,
)
from nnunet_dro.training.dataloading import CaseDraws, nnUNetDataLoaderDRO
from nnunet_dro.training.guard import RECOVER, ErmPhaseGuard
from nnunet_dro.training.hardness_report import (
    GROUPS_CSV,
    HARDNESS_CSV,
    PROGRESS_PNG,
    RedrawPacer,
    group_table,
    hardness_table,
    plot_dro_progress,
    write_group_csv,
    write_hardness_csv,
)
from nnunet_dro.training.losses import per_sample_loss_from_nnunet, uses_batch_dice
from nnunet_dro.training.nnunet_compat import (
    apply_checkpoint,
    build_dataloaders,
    checkpoint_contents,
    read_checkpoint,
    save_checkpoint_atomic,
)
from nnunet_dro.training.short_run import refuse_unread_short_run
from nnunet_dro.training.stability import (
    ALL_LEARNED,
    epoch_ranges,
    erm_phase_line,
    learning_time_line,
    pseudo_dice_history,
    stability_line,
)
from nnunet_dro.weighting import CaseWeighting
from nnunet_dro.weighting.settings import (  # noqa: F401 (L_init, re-exported)
    DEFAULT_INIT_LOSS,
    SETTINGS_CLASSES,
    AdaptiveHardnessSettings,
    FixedWeightSettings,
    HardnessSettings,
    ImportanceSettings,
    WeightingSettings,
)

#: Checkpoint key of the sampler state (stale losses, draw counts, RNG state, statistics).
DRO_STATE_KEY = "dro_state"
DRO_STATE_VERSION = 2

HISTORY_KEYS = ("epoch", "entropy", "max_entropy", "perplexity_fraction", "effective_sample_size", "ess_fraction",
                "max_probability", "beta", "clipped_fraction", "mean_raw_weight", "max_raw_weight", "num_weights",
                "robust_loss", "mean_stale_loss", "num_skipped", "hardest", "group_draws", "group_weights", "backed_off",
                "fraction")
#: Case-weighting schemes (``dro_settings.scheme``).
SCHEMES = tuple(c.scheme for c in SETTINGS_CLASSES)

def rng_states(state: Any, prefix: str = "") -> Dict[str, Any]:
    """Every random-stream state in a case weighting's ``state_dict()`` (the key ``'rng_state'`` at any
    depth), by its path (``"sampler/rng_state"``).

    >>> rng_states({"sampler": {"rng_state": 1, "losses": [0.5]}, "rng_state": 2})
    {'sampler/rng_state': 1, 'rng_state': 2}
    """
    found: Dict[str, Any] = {}
    if isinstance(state, dict):
        for key, value in state.items():
            path = f"{prefix}{key}"
            if key == "rng_state":
                found[path] = value
            else:
                found.update(rng_states(value, path + "/"))
    return found


def with_rng_states(state: Dict[str, Any], streams: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``state`` whose random-stream states at the paths of ``streams`` are replaced (a path
    that ``state`` lacks, e.g. an earlier release's layout, is left out).

    >>> with_rng_states({"sampler": {"rng_state": 1, "losses": [0.5]}}, {"sampler/rng_state": 7})
    {'sampler': {'rng_state': 7, 'losses': [0.5]}}
    """
    out = dict(state)
    for path, value in streams.items():
        *parents, last = path.split("/")
        node = out
        for key in parents:
            if not isinstance(node.get(key), dict):
                break
            node[key] = dict(node[key])  # copy along the path: the caller's state is not changed
            node = node[key]
        else:
            if last in node:
                node[last] = value
    return out


class nnUNetTrainerConfigurableSGD(nnUNetTrainer):
    """nnU-Net's optimiser (SGD, lr 1e-2, weight decay 3e-5, poly schedule) with momentum and
    Nesterov as class attributes. With the defaults it is exactly ``nnUNetTrainer``."""

    sgd_momentum: float = 0.99
    sgd_nesterov: bool = True

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        # every trainer of this package: nnUNet_dro_short_run set for one that does not read it
        # would otherwise start a full 1000 x 250 run without a word
        refuse_unread_short_run(self)

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

    def _restore_extra_checkpoint_state(self, state: Optional[Dict[str, Any]], checkpoint: Dict[str, Any],
                                        source: str) -> None:
        """Called by :meth:`load_checkpoint` with the checkpoint's ``'dro_state'`` (None if absent) and
        where it came from (a file name, for messages)."""

    def save_checkpoint(self, filename: str) -> None:
        """nnU-Net's checkpoint plus ``'dro_state'``, in one atomic write (rank 0 only, as nnU-Net)."""
        if self.local_rank != 0:
            return
        if self.disable_checkpointing:
            self.print_to_log_file('No checkpoint written, checkpointing is disabled')
            return
        checkpoint = checkpoint_contents(self)
        state = self._extra_checkpoint_state()
        if state is not None:
            checkpoint[DRO_STATE_KEY] = state
        save_checkpoint_atomic(checkpoint, filename)

    def load_checkpoint(self, filename_or_checkpoint: Union[dict, str]) -> None:
        """nnU-Net's ``load_checkpoint`` (a file name or an already loaded dict), then ``'dro_state'``."""
        if not self.was_initialized:
            self.initialize()
        checkpoint = filename_or_checkpoint if isinstance(filename_or_checkpoint, dict) \
            else read_checkpoint(self, filename_or_checkpoint)
        apply_checkpoint(self, checkpoint)
        source = "the checkpoint" if isinstance(filename_or_checkpoint, dict) else filename_or_checkpoint
        self._restore_extra_checkpoint_state(checkpoint.get(DRO_STATE_KEY), checkpoint, source)

    def _to_device(self, batch: dict):
        data = batch['data'].to(self.device, non_blocking=True)
        target = batch['target']
        if isinstance(target, list):
            target = [i.to(self.device, non_blocking=True) for i in target]
        else:
            target = target.to(self.device, non_blocking=True)
        return data, target

    def _forward_per_sample(self, data: torch.Tensor, target) -> torch.Tensor:
        """The network's forward pass and the per-sample training loss ``(b,)`` (called inside the
        autocast context of the step); the GI-LS trainers perturb the features here."""
        return self.per_sample_loss(self.network(data), target)

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


class nnUNetTrainerCaseWeighting(nnUNetTrainerPerSampleLoss):
    """The one training loop of every trainer that draws or weights cases by their loss.

    It holds one :class:`~nnunet_dro.weighting.CaseWeighting` (``self.case_weighting``), built at
    the end of :meth:`initialize` from the class attributes below (so ``--c`` restores its state
    directly), and runs one training step: forward, per-case losses, ``w = weights(...)``, step on
    ``mean(w * l)``, then ``update`` with every rank's (case, loss, draw beta). Trainers differ only
    in class attributes.

    The case weighting is ``dro_settings``, one frozen dataclass of
    :mod:`nnunet_dro.weighting.settings` whose type is the scheme: ``HardnessSettings`` (Algorithm 1,
    fixed beta), ``AdaptiveHardnessSettings`` (scale-free beta, ERM phase, probability cap, outlier
    trim, stability guard), ``Chi2HardnessSettings``, ``KLReweightSettings`` (uniform draws), and
    the schemes that use what the user knows (tables found as :mod:`nnunet_dro.training.case_tables`
    describes): ``FixedWeightSettings`` (``case_weights.tsv``), ``GroupBalancedSettings`` and
    ``GroupDROSettings`` (groups of ``subgroups.tsv``). A field exists only on the scheme it acts on,
    so e.g. an ERM phase on the fixed-beta scheme cannot be written. A variant replaces fields::

        dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, fraction=0.25)

    Reporting attributes stay plain attributes:
    ``dro_num_hardest_logged``, ``dro_write_report_every_epoch``, ``dro_progress_time_fraction``.
    """

    dro_settings: WeightingSettings = HardnessSettings()
    dro_num_hardest_logged: int = 5
    dro_write_report_every_epoch: bool = True
    #: dro_progress.png is redrawn after an epoch only while drawing it takes at most this fraction of
    #: the wall time (0.3-0.8 s a drawing; 1.0: nearly every epoch); always at the end of training
    dro_progress_time_fraction: float = 0.01

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.case_weighting: Optional[CaseWeighting] = None
        #: the ERM phase and stability guard of dro_settings (None: the scheme has neither), built
        #: with the case weighting
        self.dro_phase: Optional[ErmPhaseGuard] = None
        self.dro_case_ids: Optional[List[str]] = None
        self._dro_index_of: Dict[str, int] = {}
        self.per_sample_loss: Optional[nn.Module] = None
        self._dro_history: Dict[str, list] = {k: [] for k in HISTORY_KEYS}
        self._dro_final_state: Optional[Dict[str, Any]] = None
        #: every rank's random streams at the last save_checkpoint (DDP only; rank r at index r)
        self._dro_rank_streams: Optional[List[Dict[str, Any]]] = None
        try:
            self._dro_progress_pacer = RedrawPacer(self.dro_progress_time_fraction)
        except ValueError as e:
            raise RuntimeError(f"{type(self).__name__}.dro_progress_time_fraction: {e}") from None

    # ------------------------------------------------------------------ set-up
    @property
    def scheme(self) -> str:
        """The scheme's name (``dro_settings``' type's ``scheme``; the ``'scheme'`` of the state)."""
        return self.dro_settings.scheme

    def initialize(self):
        super().initialize()
        tr_keys, _ = self.do_split()
        self._create_case_weighting(tr_keys)
        self.print_to_log_file(f"DRO: {self.case_weighting.describe()}, over {len(self.dro_case_ids)} training "
                               f"cases; SGD momentum={self.sgd_momentum}, nesterov="
                               f"{self.sgd_nesterov and self.sgd_momentum > 0}")

    def build_case_weighting(self, num_cases: int) -> CaseWeighting:
        """The scheme of ``dro_settings`` (override for a scheme of your own)."""
        settings = self.dro_settings
        if settings.needs_table:
            return self._build_table_weighting(settings)
        return settings.build(num_cases, rank=self.local_rank, shared=True)

    def build_dro_phase(self) -> Optional[ErmPhaseGuard]:
        """The ERM phase and stability guard of ``dro_settings``, the collaborator called at the end
        of every epoch (:class:`~nnunet_dro.training.guard.ErmPhaseGuard`): the scale-free scheme's
        settings carry them; None for a scheme without (override for a scheme of your own, as the
        error-set trainer does)."""
        if isinstance(self.dro_settings, AdaptiveHardnessSettings):
            return ErmPhaseGuard.from_settings(self.dro_settings, self)
        return None

    def _build_table_weighting(self, settings: WeightingSettings) -> CaseWeighting:
        """Fixed case weights, group-balanced sampling or group DRO, from the user's tables."""
        where = dict(dataset_name=self.plans_manager.dataset_name,
                     preprocessed_base=os.path.dirname(self.preprocessed_dataset_folder_base), raw_base=nnUNet_raw)
        if isinstance(settings, FixedWeightSettings):
            path = find_case_table(CASE_WEIGHTS_FILENAME, CASE_WEIGHTS_ENV, **where)
            all_cases = [str(c) for c in self.dataset_class.get_identifiers(self.preprocessed_dataset_folder)]
            weights = read_case_weights(path, self.dro_case_ids, all_cases)
            self.print_to_log_file(f"DRO: case weights from {path}")
            return settings.build(weights, rank=self.local_rank, shared=True)
        path = find_case_table(SUBGROUPS_FILENAME, SUBGROUPS_ENV, **where)
        column, groups = read_case_groups(path, self.dro_case_ids,
                                          os.environ.get(GROUP_COLUMN_ENV) or settings.column)
        self.print_to_log_file(f"DRO: groups from column {column!r} of {path}")
        return settings.build(groups, rank=self.local_rank, shared=True)

    def _create_case_weighting(self, case_ids: Sequence[str]) -> None:
        self._close_case_weighting()
        self.dro_case_ids = sorted(str(c) for c in case_ids)
        self._dro_index_of = {c: i for i, c in enumerate(self.dro_case_ids)}
        if not isinstance(self.dro_settings, WeightingSettings):
            raise RuntimeError(f"{type(self).__name__}.dro_settings = {self.dro_settings!r}: expected the settings "
                               f"of a scheme of nnunet_dro.weighting.settings (e.g. AdaptiveHardnessSettings())")
        try:
            self.dro_phase = self.build_dro_phase()
        except ValueError as e:
            raise RuntimeError(f"{type(self).__name__}.dro_settings.guard_recover: {e}") from None
        self.case_weighting = self.build_case_weighting(len(self.dro_case_ids))
        if self.is_ddp:
            self._start_from_rank0_state()

    def _start_from_rank0_state(self) -> None:
        """Under DDP every rank must hold the same case weighting from the start: the tie-breaking noise
        of ``L_init`` comes from each rank's own random stream (seed + rank, or fresh entropy), so the
        cases not drawn yet, p and the hardest-case order would differ between ranks for as long as a
        case stays undrawn. Rank 0's state is broadcast; each rank keeps its own random stream (its
        draws stay its own)."""
        import torch.distributed as dist

        own = self.case_weighting.state_dict()
        box = [own if self.local_rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        if self.local_rank != 0:
            self.case_weighting.load_state_dict(with_rng_states(box[0], rng_states(own)))

    def _close_case_weighting(self) -> None:
        if self.case_weighting is not None:
            self.case_weighting.close()
            self.case_weighting = None

    def get_dataloaders(self):
        """nnU-Net's ``get_dataloaders``, with the training loader drawing from the case weighting
        (nnU-Net's own loaders when the scheme draws uniformly)."""
        if self.case_weighting.uniform_draws:
            return super().get_dataloaders()

        def make_train_loader(dataset_tr, initial_patch_size, tr_transforms):
            if sorted(str(i) for i in dataset_tr.identifiers) != self.dro_case_ids:
                raise RuntimeError(f"DRO: the training cases of fold {self.fold} changed since initialize()")
            return nnUNetDataLoaderDRO(dataset_tr, self.batch_size, initial_patch_size,
                                       self.configuration_manager.patch_size, self.label_manager,
                                       CaseDraws(self.dro_case_ids, self.case_weighting),
                                       oversample_foreground_percent=self.oversample_foreground_percent,
                                       pad_sides=None, transforms=tr_transforms,
                                       probabilistic_oversampling=self.probabilistic_oversampling)

        # the first training batch is drawn but not trained on, so it does not update the state
        return build_dataloaders(self, make_train_loader)

    # ------------------------------------------------------------------ training step
    def on_train_epoch_start(self):
        super().on_train_epoch_start()
        self.case_weighting.set_progress(self.current_epoch / max(1, self.num_epochs))

    def _batch_indices(self, keys) -> np.ndarray:
        try:
            return np.fromiter((self._dro_index_of[str(k)] for k in keys), dtype=np.int64, count=len(keys))
        except KeyError as e:
            raise RuntimeError(f"DRO: the training batch contains case {e} that is not a training case of "
                               f"fold {self.fold}") from None

    def train_step(self, batch: dict) -> dict:
        indices = self._batch_indices(batch['keys'])
        # the beta each case was drawn with (adaptive schemes change it between draw and step)
        draw_beta = np.asarray(batch.get('dro_beta', np.full(indices.size, np.nan)), dtype=np.float64).reshape(-1)
        data, target = self._to_device(batch)
        # weights known before the losses (importance weights off, group-balanced...): sent now, and
        # the backward pass is queued without the host waiting for the forward pass (GPU)
        early = self.case_weighting.weights_before_loss(indices, draw_beta)
        if early is not None:
            early = torch.from_numpy(early.astype(np.float32)).to(self.device, non_blocking=True)

        self.optimizer.zero_grad(set_to_none=True)
        # autocast only on CUDA, as in nnU-Net
        with autocast(self.device.type, enabled=True) if self.device.type == 'cuda' else dummy_context():
            per_sample = self._forward_per_sample(data, target)
            if early is None:
                # the weights need the fresh losses on the host: one small device->host copy of b
                # values, which waits for the forward pass
                fresh = per_sample.detach().float().cpu().numpy().astype(np.float64)
                weights = torch.from_numpy(self.case_weighting.weights(indices, fresh, draw_beta).astype(np.float32))
                l = (weights.to(per_sample.device) * per_sample).mean()
            else:
                l = (early * per_sample).mean()
        self._optimizer_step(l)
        if early is not None:  # after the step is queued, where nnU-Net copies its own loss
            fresh = per_sample.detach().float().cpu().numpy().astype(np.float64)
        # report the unweighted mean so that train_loss stays comparable with nnU-Net's
        unweighted = np.array(fresh.mean())

        if self.is_ddp:
            indices, fresh, draw_beta = all_gather_updates(indices, fresh, draw_beta)
        self.case_weighting.update(indices, fresh, draw_beta)
        return {'loss': unweighted}

    # ------------------------------------------------------------------ per-epoch statistics
    def on_train_epoch_end(self, train_outputs: List[dict]):
        super().on_train_epoch_end(train_outputs)
        self._record_and_log_dro_statistics()

    def _record_and_log_dro_statistics(self) -> None:
        stats = self.case_weighting.epoch_stats(k=self.dro_num_hardest_logged)
        hardest = [(self.dro_case_ids[i], loss) for i, loss in stats["hardest"]]
        record = {**{k: stats.get(k) for k in HISTORY_KEYS}, "epoch": int(self.current_epoch), "hardest": hardest}
        # a resumed run may repeat an epoch that a later checkpoint had recorded
        while self._dro_history["epoch"] and self._dro_history["epoch"][-1] >= record["epoch"]:
            for k in HISTORY_KEYS:
                self._dro_history[k].pop()
        for k in HISTORY_KEYS:
            self._dro_history.setdefault(k, []).append(record[k])

        n = len(self.dro_case_ids)
        weights_text = (f"clipped importance weights {100 * stats['clipped_fraction']:.1f}% of {stats['num_weights']} "
                        f"(mean raw weight {stats['mean_raw_weight']:.3g})"
                        if stats["num_weights"] and math.isfinite(stats["clipped_fraction"]) else "importance weights n/a")
        beta_text = f"beta {stats['beta']:.4g}, " if math.isfinite(stats["beta"]) else ""  # schemes without beta
        self.print_to_log_file(
            f"DRO: {beta_text}perplexity {stats['perplexity_fraction'] * n:.2f} of {n} "
            f"(entropy {stats['entropy']:.4f}, uniform {stats['max_entropy']:.4f}), effective sample size "
            f"{stats['effective_sample_size']:.2f} of {n}, max p {stats['max_probability']:.4f}, {weights_text}, "
            f"robust loss {stats['robust_loss']:.4f}, mean stale loss {stats['mean_stale_loss']:.4f}"
            + (f", skipped non-finite losses {stats['num_skipped']}" if stats['num_skipped'] else "")
            + self._uniform_phase_text())
        self.print_to_log_file("DRO: hardest cases: " + ", ".join(f"{c} ({v:.4f})" for c, v in hardest))
        if stats.get("trimmed_cases"):
            self.print_to_log_file("DRO: trimmed (left out of the hardness distribution, drawn at the uniform rate): "
                                   + ", ".join(self.dro_case_ids[i] for i in stats["trimmed_cases"]))
        if stats.get("group_draws") is not None:
            q = stats.get("group_weights") or {}
            self.print_to_log_file("DRO: draws per group this epoch: " + ", ".join(
                f"{g} {d}" + (f" (q {q[g]:.3f})" if g in q else "") for g, d in stats["group_draws"].items()))

    def _uniform_phase_text(self) -> str:
        """Why this epoch's draws were uniform, for its statistics line ('' if they were not held
        uniform): beta, perplexity and max p alone would not tell an ERM epoch from a robust one."""
        w = self.case_weighting
        if not getattr(w, "in_uniform_phase", False):
            return ""
        if getattr(w, "held_uniform", False) or getattr(w, "progress", 1.0) < getattr(w, "uniform_until", 0.0):
            return "; uniform sampling (ERM phase): no robust weighting yet"
        return "; uniform sampling (backed off by the stability guard)"

    def on_epoch_end(self):
        super().on_epoch_end()
        history = pseudo_dice_history(self)
        if self.local_rank == 0:
            self.print_to_log_file("DRO " + stability_line(history))
        if self.dro_phase is not None:
            self.dro_phase.on_epoch_end(history)
        if self.dro_write_report_every_epoch:
            self.write_hardness_report(redraw_now=False)

    def on_train_end(self):
        super().on_train_end()  # saves checkpoint_final.pth (with dro_state), stops the workers
        if self.local_rank == 0 and self.case_weighting is not None:
            history = pseudo_dice_history(self)
            phase = self.dro_phase
            erm = None if phase is None else phase.erm_phase_epochs(history)
            never_left = erm is not None and len(erm) == self.num_epochs
            if erm is not None:
                self.print_to_log_file("DRO: " + erm_phase_line(erm, self.num_epochs, never_left, phase.until_learned))
            # the robustness benchmark found the gains only where every structure was learned within
            # the first half of the budget (docs/evidence.md); a run that never left its ERM phase
            # gets no word about robust weighting, which it never did
            self.print_to_log_file("DRO: " + learning_time_line(
                history, self.num_epochs,
                advice="this run never left its ERM phase and so trained as nnUNetTrainer does: consider more "
                       "epochs" if never_left else
                       "robust weighting draws hard cases more and so leaves fewer draws for what every case "
                       "still lacks: consider more epochs"))
            guard_line = None if phase is None else phase.summary_line(history, erm)
            if guard_line is not None:
                self.print_to_log_file(guard_line)
        self.write_hardness_report()
        if self.case_weighting is not None:
            # keep the final state for any later save_checkpoint; release the shared memory
            self._dro_final_state = self._dro_state()
            self._close_case_weighting()

    def _structure_names(self) -> List[str]:
        """The names of the structures nnU-Net's pseudo-Dice lists, in its order (dataset.json's
        label names; a region is named by the label whose value it is)."""
        lm = self.label_manager
        by_value = {}
        for name, value in self.dataset_json.get("labels", {}).items():
            key = tuple(value) if isinstance(value, (list, tuple)) else (int(value),)
            by_value.setdefault(key, name)
        structures = lm.foreground_regions if lm.has_regions else lm.foreground_labels
        out = []
        for s in structures:
            key = tuple(s) if isinstance(s, (list, tuple)) else (int(s),)
            out.append(by_value.get(key, str(s)))
        return out

    def write_hardness_report(self, redraw_now: bool = True) -> None:
        """Write ``dro_hardness.csv`` and ``dro_progress.png`` to the fold folder (rank 0 only); with
        ``redraw_now=False`` the png only when ``dro_progress_time_fraction`` allows it."""
        if self.local_rank != 0 or self.case_weighting is None:
            return
        w = self.case_weighting
        groups = w.groups
        table = self._hardness_table()
        write_hardness_csv(join(self.output_folder, HARDNESS_CSV), table)
        if groups is not None:
            q = w.group_weights()
            write_group_csv(join(self.output_folder, GROUPS_CSV), group_table(table, q))
        self._dro_progress_pacer.draw(
            lambda: plot_dro_progress(join(self.output_folder, PROGRESS_PNG), self._dro_history,
                                      len(self.dro_case_ids)),
            force=redraw_now)

    def _hardness_table(self):
        """The rows of ``dro_hardness.csv`` (a scheme with more to say per case adds columns)."""
        w = self.case_weighting
        return hardness_table(self.dro_case_ids, np.array(w.losses), w.probabilities(), np.array(w.draw_counts),
                              groups=w.groups)

    # ------------------------------------------------------------------ checkpoint
    def _dro_state(self) -> Optional[Dict[str, Any]]:
        if self.case_weighting is None:
            return self._dro_final_state
        return {
            "version": DRO_STATE_VERSION,
            "scheme": self.case_weighting.scheme,
            "case_ids": list(self.dro_case_ids),
            "weighting": self.case_weighting.state_dict(),
            "history": deepcopy(self._dro_history),
            # what the run was trained with (plain values; read by people and tests, not by --c)
            "config": self.dro_settings.as_dict(),
        }

    def save_checkpoint(self, filename: str) -> None:
        """nnU-Net's checkpoint with ``'dro_state'``; under DDP it also holds every rank's random
        streams (``'rank_rng_states'``), so that ``--c`` gives each rank its own stream back instead of
        rank 0's (with ``nnUNet_n_proc_DA=0`` every rank would then draw the same cases). The
        gathering is collective: nnU-Net calls ``save_checkpoint`` on every rank at the same epochs."""
        self._dro_rank_streams = self._gather_rank_streams()
        super().save_checkpoint(filename)

    def _gather_rank_streams(self) -> Optional[List[Dict[str, Any]]]:
        if not self.is_ddp:
            return None
        import torch.distributed as dist

        if self.case_weighting is not None:
            own = rng_states(self.case_weighting.state_dict())
        else:  # after on_train_end: the state it kept
            own = rng_states((self._dro_final_state or {}).get("weighting", {}))
        streams: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(streams, own)
        return streams

    def _extra_checkpoint_state(self) -> Optional[Dict[str, Any]]:
        state = self._dro_state()
        if state is not None and self._dro_rank_streams is not None:
            state = {**state, "rank_rng_states": self._dro_rank_streams}
        return state

    def _own_random_streams(self, weighting_state: Dict[str, Any], state: Dict[str, Any]) -> Dict[str, Any]:
        """The saved weighting state with this rank's own random streams (DDP): those rank r saved, or,
        when the checkpoint has none for it (written by fewer ranks, or by an earlier release), the
        stream this rank was built with; rank 0 and single-process runs keep the saved ones."""
        if not self.is_ddp:
            return weighting_state
        saved = state.get("rank_rng_states") or []
        if self.local_rank < len(saved) and saved[self.local_rank] is not None:
            return with_rng_states(weighting_state, saved[self.local_rank])
        if self.local_rank == 0:
            return weighting_state
        self.print_to_log_file(f"DRO: the checkpoint holds no random stream of rank {self.local_rank} (written by "
                               f"{len(saved) or 'one or an unknown number of'} rank(s)): this rank draws from a "
                               f"new stream of its own")
        return with_rng_states(weighting_state, rng_states(self.case_weighting.state_dict()))

    def _restore_extra_checkpoint_state(self, state: Optional[Dict[str, Any]], checkpoint: Dict[str, Any],
                                        source: str) -> None:
        if state is None:
            # resuming without the stale losses would silently restart the weighting from L_init
            raise RuntimeError(f"DRO: {source} has no '{DRO_STATE_KEY}' (written by {checkpoint.get('trainer_name')!r}, "
                               f"not by a case-weighting trainer of nnunet_dro?); cannot resume "
                               f"{type(self).__name__} from it. Start a new training, or use nnUNetv2_train's "
                               f"-pretrained_weights to start from its network weights only.")
        if self.case_weighting is None:  # load_checkpoint initialises first; this is a safety net
            raise RuntimeError("DRO: load_checkpoint before initialize()")
        state = self._trim_history(state, int(checkpoint.get("current_epoch", 0)))
        weighting_state = state["weighting"]
        saved_ids = state.get("case_ids")
        if saved_ids is not None and list(saved_ids) != list(self.dro_case_ids):
            raise RuntimeError(
                f"DRO: the checkpoint's case-weighting state is for {len(saved_ids)} training cases that differ "
                f"from the {len(self.dro_case_ids)} training cases of fold {self.fold} now (was splits_final.json "
                f"changed?). Resume with the original split or start a new training.")
        saved_scheme = state.get("scheme")
        if saved_scheme is not None and saved_scheme != self.case_weighting.scheme \
                and {saved_scheme, self.case_weighting.scheme} != {"kl", "kl_adaptive"}:
            raise RuntimeError(f"DRO: the checkpoint was trained with the {saved_scheme!r} scheme, this trainer uses "
                               f"{self.case_weighting.scheme!r}; resume with the trainer that wrote it")
        self.case_weighting.load_state_dict(self._own_random_streams(weighting_state, state))
        self._dro_history = {k: list(state.get("history", {}).get(k, [])) for k in HISTORY_KEYS}
        if self.dro_phase is not None:
            self.dro_phase.on_resume(pseudo_dice_history(self))  # the guard's state for the next epoch
        self.print_to_log_file(f"DRO: restored the case-weighting state of {len(self.dro_case_ids)} cases from the "
                               f"checkpoint")

    @staticmethod
    def _trim_history(state: Dict[str, Any], next_epoch: int) -> Dict[str, Any]:
        """Drop statistics of epochs the resumed run will redo (e.g. from a 'best' checkpoint)."""
        history = state.get("history") or {}
        keep = [i for i, e in enumerate(history.get("epoch", [])) if e < next_epoch]
        state = dict(state)
        state["history"] = {k: [history[k][i] for i in keep] if k in history else [] for k in HISTORY_KEYS}
        return state


def _epoch_ranges(epochs: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    return epoch_ranges(epochs)


class nnUNetTrainerDRO(nnUNetTrainerCaseWeighting):
    """nnU-Net training with hardness weighted sampling, exactly the paper's setting: KL, beta 100,
    importance weights clipped to [0.1, 10] (Fidon et al., "Distributionally Robust Deep Learning
    using Hardness Weighted Sampling", arXiv:2001.02658, Algorithm 1). See the module docstring
    for what changes compared with ``nnUNetTrainer``; the attributes are those of
    :class:`nnUNetTrainerCaseWeighting`."""

    dro_settings = HardnessSettings(beta=100.0, importance=ImportanceSettings(enabled=True, clip=(0.1, 10.0)))


class nnUNetTrainerDROAdaptive(nnUNetTrainerDRO):
    """Scale-free hardness weighted sampling, f = 0.5 without importance weights, no case drawn
    with more than 5 times the uniform probability, after an ERM phase that lasts until every
    structure is learned, and the stability guard on. What it achieved and where it did not:
    docs/evidence.md. Its gains need a budget at which nnU-Net learns every structure well before
    the end; the end of the training log says whether a run had one.

    The ERM phase (``uniform_until_learned = 0.2``): uniform sampling until the first epoch at
    whose end every structure's pseudo-Dice is at least 0.2, robust weighting from the next epoch
    on. Drawing hard cases more means fewer draws for what every case still lacks: robust weighting
    from the first epoch kept two structures from being learned at all in one 40-case run of four,
    and wrecked the majority (docs/evidence.md). A run that learns its last structure late thus gets
    little DRO, and a run that never learns it trains as ERM. Why 0.2 and not 0.5: a small structure
    can stay below 0.5 in a converged ERM run, while every structure passes 0.2 within a few epochs
    of leaving 0. ``nnUNetTrainerDROAdaptive_fromStart`` is the same without the ERM phase.

    ``beta_t`` is re-solved from the stale losses so that the drawing distribution stays spread over
    at least ``fraction`` (here 50 %) of the training cases (perplexity ``exp(H(p)) >= f n``,
    the KL-constrained DRO problem), capped at ``beta_max`` = 100 (the paper's beta). No case
    gets more than ``max_weight / n`` of the probability (``p = softmax(beta_t * min(L, tau))``:
    the KL ball intersected with a CVaR box; without it one outlier can take a quarter of the draws
    at f = 0.5). The step is the plain mean over the cases drawn (``importance.enabled =
    False``): the DRO gradient at the stale losses. With importance weights on (the ``_f25`` ...
    ``_f90`` variants) they use the beta a case was drawn with, are 1 at a case's first draw (its
    stale loss is still ``L_init``) and are self-normalised (their running mean is divided out, so
    the optimiser's effective learning rate stays nnU-Net's).
    """

    dro_settings = AdaptiveHardnessSettings(
        fraction=0.5, beta_max=100.0, max_weight=5.0, guard=True, guard_recover=RECOVER,
        uniform_until_learned=ALL_LEARNED,
        # off; the variants that turn them on get draw-time-beta weights, 1 at a first draw, self-normalised
        importance=ImportanceSettings(enabled=False, first_draw_one=True, self_normalise=True))

    # the ERM phase and guard live in ``self.dro_phase``; these two names stay for callers that
    # drive them epoch by epoch (tests, subclasses)
    def _release_when_learned(self, history: list) -> None:
        self.dro_phase.release_when_learned(history)

    def _apply_guard(self, history: list, announce: bool) -> None:
        self.dro_phase.apply_guard(history, announce)
