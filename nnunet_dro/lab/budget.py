"""CPU-budget trainers for the demo and the robustness benchmark: real classes, nnU-Net names.

A robustness claim needs a network that has learned the majority of the data; nnU-Net's default
budget (1000 epochs x 250 iterations of a 32..320-feature U-Net) needs a GPU. ``<Trainer>_CPUBudget``
keeps everything of ``<Trainer>`` (plans, patch size, loss, augmentation, sampling, weighting) and
changes only what a 2-core CPU cannot afford:

- the network is narrower: a quarter of nnU-Net's features per stage (``budget_width_divisor``);
  the same class of network, stages, kernels and strides, so prediction uses the same class;
- the budget is 120 epochs x 25 iterations = 3000 iterations, 3 validation iterations per epoch
  (a :class:`~nnunet_dro.training.short_run.ShortRun` of that size);
- nnU-Net's final validation is skipped (``budget_final_validation``): with fold ``all`` it only
  re-predicts the training cases; the benchmark evaluates a held-out test set instead;
- nnU-Net's ``progress.png`` is drawn every ``short_plot_every``-th epoch and after the last, not
  after every epoch: drawing it costs 1-4 s of a busy CPU core, more than a third of a budget epoch
  (measured December 5, 2026); no training result depends on it;
- ``nnUNet_dro_short_run`` (``EPOCHS[xITERATIONS]``, the one short-run variable of
  :mod:`nnunet_dro.training.short_run`) overrides the budget (quick looks and tests; every
  figure we report uses the class defaults);
- with ``nnUNet_dro_seed`` set (an integer), torch is seeded right before the network is built,
  so every arm of one benchmark repetition starts from the same initial weights, and a DRO
  trainer's draws use that seed (the augmentation workers stay unseeded, as in nnU-Net);
- ``nnUNet_dro_final_validation=1`` keeps nnU-Net's final validation (a fold with held-out cases:
  the converged regime's calibration reads ERM's ``validation/summary.json``);
- ``nnUNet_dro_keep_checkpoints=50,75`` (percent of the epochs) also saves the network at the end
  of those epochs as ``checkpoint_epoch_<E>.pth``, beside nnU-Net's files, so that the training
  fit can be scored part-way through one training (``nnUNetv2_predict -chk``) instead of in
  trainings of several lengths;
- ``nnUNet_dro_torch_threads`` sets torch's threads for the training. On CPU ``nnUNetv2_train`` gives
  torch every core, so two trainings side by side oversubscribe them; pinned to one core each
  (``taskset -c``) with one thread, two 240-epoch benchmark trainings on 2 cores finished together
  in 1.2 times less time than two one after the other. Threads change no result beyond float rounding.

Every trainer of :mod:`nnunet_dro.training.registry` and of the lab's variants
(:mod:`nnunet_dro.lab.variants`, the benchmark's ablation arms) gets its twin (``X_CPUBudget`` is ``class
X_CPUBudget(CPUBudget, X)``, made by :func:`budget_twin`), found by ``nnUNetv2_train -tr`` /
``nnUNetv2_predict -tr`` like every trainer of ours.
"""
from __future__ import annotations

import math
import os
from copy import deepcopy
from dataclasses import replace

import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from nnunetv2.training.nnUNetTrainer.variants.loss.nnUNetTrainerTopkLoss import (
    nnUNetTrainerDiceTopK10Loss,
    nnUNetTrainerTopk10Loss,
)
from nnunetv2.training.nnUNetTrainer.variants.sampling.nnUNetTrainer_probabilisticOversampling import (
    nnUNetTrainer_probabilisticOversampling_033,
)
from nnunetv2.utilities.plans_handling.plans_handler import ConfigurationManager, PlansManager

from nnunet_dro.lab.variants import LAB_VARIANTS
from nnunet_dro.training.registry import PREFIX, TRAINERS
from nnunet_dro.training.short_run import SHORT_RUN_ENV, ShortRun  # noqa: F401 (SHORT_RUN_ENV: the budget's override)
from nnunet_dro.training.stability import learning_time_line, pseudo_dice_history, stability_line

#: Environment variables (nnU-Net style): the seed of a benchmark repetition and torch's threads
#: (the budget's override is the short run's, ``SHORT_RUN_ENV``).
SEED_ENV = "nnUNet_dro_seed"
THREADS_ENV = "nnUNet_dro_torch_threads"
FINAL_VALIDATION_ENV = "nnUNet_dro_final_validation"
KEEP_CHECKPOINTS_ENV = "nnUNet_dro_keep_checkpoints"


def _int_from_env(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise RuntimeError(f"{name}={text!r} is not an integer") from None


def epoch_at(percent: float, epochs: int) -> int:
    """The epoch (1-based) at ``percent`` of a schedule of ``epochs``, halves rounded up (Python's
    ``round`` rounds them to even, so 25 % of 10 epochs would be epoch 2 but 25 % of 6 epoch 2 too).

    >>> epoch_at(25, 10), epoch_at(75, 6), epoch_at(75, 800), epoch_at(1, 10)
    (3, 5, 600, 1)
    """
    return max(1, math.floor(percent / 100 * epochs + 0.5))


def kept_checkpoint_epochs(text: str, epochs: int) -> tuple[int, ...]:
    """The epochs (1-based, counted as nnU-Net's ``current_epoch + 1``) at whose end a copy of the
    network is kept, from percentages of ``epochs``; 100 % is nnU-Net's own final checkpoint.

    >>> kept_checkpoint_epochs("50,75", 800), kept_checkpoint_epochs(" 25, 100 ", 10), kept_checkpoint_epochs("", 5)
    ((400, 600), (3,), ())
    """
    kept = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            percent = float(item)
        except ValueError:
            raise RuntimeError(f"{KEEP_CHECKPOINTS_ENV}={text!r}: {item!r} is not a percentage") from None
        if not 0 < percent <= 100:
            raise RuntimeError(f"{KEEP_CHECKPOINTS_ENV}={text!r}: {item} is not a percentage in (0, 100]")
        epoch = epoch_at(percent, epochs)
        if epoch < epochs:
            kept.append(epoch)
    return tuple(sorted(set(kept)))


def checkpoint_name(epoch: int) -> str:
    """The file of a kept network: ``checkpoint_epoch_<E>.pth`` (E: epochs trained)."""
    return f"checkpoint_epoch_{epoch}.pth"


def budget_seed() -> int | None:
    """The seed from ``$nnUNet_dro_seed`` (None if unset or empty)."""
    return _int_from_env(SEED_ENV)


class CPUBudget(ShortRun):
    """Mixin: the CPU budget described in the module docstring. Put it *first* in the bases."""

    short_epochs: int = 120
    short_iterations: int = 25
    short_val_iterations: int = 3
    #: the budget's epochs (``nnunet_dro demo`` scales them)
    budget_epochs: int = short_epochs
    budget_width_divisor: int = 4
    budget_min_features: int = 4
    budget_final_validation: bool = False
    short_plot_every: int | None = 10
    #: epochs at whose end a copy of the network is kept (``nnUNet_dro_keep_checkpoints``; set per run)
    kept_epochs: tuple[int, ...] = ()

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        threads = _int_from_env(THREADS_ENV)
        if threads is not None:
            if threads < 1:
                raise RuntimeError(f"{THREADS_ENV}={threads}: must be at least 1")
            torch.set_num_threads(threads)  # after nnUNetv2_train's own set_num_threads(cpu_count())
        if os.environ.get(FINAL_VALIDATION_ENV, "").strip() not in ("", "0"):
            self.budget_final_validation = True  # this run only: the class keeps its default
        self.kept_epochs = kept_checkpoint_epochs(os.environ.get(KEEP_CHECKPOINTS_ENV, ""), self.num_epochs)
        seed = budget_seed()
        settings = getattr(self, "dro_settings", None)
        if seed is not None and settings is not None:
            # an instance attribute: the class (and every other run of it) keeps its settings
            self.dro_settings = replace(settings, seed=seed)

    @classmethod
    def build_network_architecture(cls, plans_manager: PlansManager, configuration_manager: ConfigurationManager,
                                   num_input_channels: int, num_output_channels: int,
                                   enable_deep_supervision: bool = True) -> torch.nn.Module:
        """nnU-Net's network with ``features_per_stage`` divided by ``budget_width_divisor``."""
        narrow = ConfigurationManager(deepcopy(configuration_manager.configuration))
        kwargs = narrow.network_arch_init_kwargs
        kwargs["features_per_stage"] = [max(cls.budget_min_features, int(f) // cls.budget_width_divisor)
                                        for f in kwargs["features_per_stage"]]
        return super().build_network_architecture(plans_manager, narrow, num_input_channels, num_output_channels,
                                                  enable_deep_supervision)

    def initialize(self):
        seed = budget_seed()
        if seed is not None:
            torch.manual_seed(seed)  # the same initial weights in every arm of a repetition
        super().initialize()
        self.print_to_log_file(
            f"CPU budget: {self.num_epochs} epochs x {self.num_iterations_per_epoch} iterations, network features "
            f"{self.network_features()}, torch threads {torch.get_num_threads()}"
            + (f", seed {seed}" if seed is not None else ""))

    def network_features(self) -> list[int]:
        kwargs = self.configuration_manager.network_arch_init_kwargs
        return [max(self.budget_min_features, int(f) // self.budget_width_divisor) for f in kwargs["features_per_stage"]]

    def on_epoch_end(self):
        epoch = self.current_epoch
        if epoch + 1 in self.kept_epochs:
            # before nnU-Net's on_epoch_end, which advances current_epoch: the file records the
            # epochs trained as nnU-Net's own checkpoints do; every rank calls it, as nnU-Net does
            self.save_checkpoint(os.path.join(self.output_folder, checkpoint_name(epoch + 1)))
        super().on_epoch_end()  # ShortRun's: progress.png every short_plot_every-th epoch
        if self.local_rank == 0 and not hasattr(self, "case_weighting"):  # DRO trainers log it themselves
            self.print_to_log_file(stability_line(pseudo_dice_history(self)))

    def on_train_end(self):
        super().on_train_end()
        if self.local_rank == 0 and not hasattr(self, "case_weighting"):  # DRO trainers log it themselves
            self.print_to_log_file(learning_time_line(pseudo_dice_history(self), self.num_epochs))

    def perform_actual_validation(self, save_probabilities: bool = False):
        if not self.budget_final_validation:
            self.print_to_log_file("CPU budget: nnU-Net's final validation skipped (the benchmark evaluates a test set)")
            return
        super().perform_actual_validation(save_probabilities)


class nnUNetTrainer_CPUBudget(CPUBudget, nnUNetTrainer):
    """nnU-Net's ERM trainer with the CPU budget."""


#: a CPU-budget twin's name: its trainer's and this
BUDGET_SUFFIX = "_CPUBudget"


def budget_twin(trainer: type) -> type:
    """``<Trainer>_CPUBudget``: ``trainer`` with the CPU budget (``class X_CPUBudget(CPUBudget, X)``,
    made by ``type`` so that every trainer of :mod:`nnunet_dro.training.registry` has one)."""
    name = trainer.__name__ + BUDGET_SUFFIX
    return type(name, (CPUBudget, trainer), {"__module__": __name__, "__qualname__": name,
                                             "__doc__": f"``{trainer.__name__}`` with the CPU budget."})


#: what nnU-Net itself offers for rare or small structures, and what its maintainers point users to:
#: losses on the hardest 10 % of voxels, and foreground oversampling (the benchmark's comparison arms)
NNUNET_ALTERNATIVES = (nnUNetTrainerDiceTopK10Loss, nnUNetTrainerTopk10Loss, nnUNetTrainer_probabilisticOversampling_033)

#: every CPU-budget trainer by name: nnU-Net's ERM, a twin of every trainer of ours and of nnU-Net's
#: alternatives. A second run of one of them (the benchmark's ``ERM_repeat``, ``JTT``) is another
#: results folder, not another class (:data:`nnunet_dro.lab.arm_runs.ARM_PLANS`).
BUDGET_TRAINERS: dict[str, type] = {
    "nnUNetTrainer_CPUBudget": nnUNetTrainer_CPUBudget,
    **{twin.__name__: twin for twin in map(budget_twin, (*TRAINERS.values(), *LAB_VARIANTS.values(),
                                                         *NNUNET_ALTERNATIVES))},
}


globals().update(BUDGET_TRAINERS)  # module attributes, so nnU-Net's lookup by name finds them


def arm_name(trainer_name: str) -> str:
    """The benchmark arm of a trainer: its name without ``nnUNetTrainer`` and ``_CPUBudget``
    (``ERM`` for nnU-Net's own trainer).

    >>> arm_name("nnUNetTrainerDROAdaptive_f90_noIS_CPUBudget"), arm_name("nnUNetTrainer_CPUBudget")
    ('DROAdaptive_f90_noIS', 'ERM')
    """
    name = trainer_name[:-len(BUDGET_SUFFIX)] if trainer_name.endswith(BUDGET_SUFFIX) else trainer_name
    return "ERM" if name == PREFIX else name[len(PREFIX):].lstrip("_") if name.startswith(PREFIX) else name
