"""How steady a training run was: epochs in which nnU-Net's pseudo-Dice lost a structure.

nnU-Net logs one pseudo-Dice per foreground label (or region) at the end of every epoch
(``self.logger.my_fantastic_logging['dice_per_class_or_region']``; also in the checkpoint under
``'logging'``). A weighted step that destabilises the optimiser shows as structures whose Dice
drops to about 0 after the network had time to learn them. The count ignores the first
``start_epoch`` epochs, in which small structures are legitimately still at 0.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

START_EPOCH = 10
THRESHOLD = 0.05
LEARNED = 0.5
#: a structure counts as learned (in :func:`all_learned_epoch`) from this pseudo-Dice on: the ERM
#: phase of the default ``nnUNetTrainerDROAdaptive`` uses the same threshold
ALL_LEARNED = 0.2


def collapsed_epochs(dice_per_epoch: Sequence[Sequence[float]], start_epoch: int = START_EPOCH,
                     threshold: float = THRESHOLD) -> int:
    """Number of epochs ``>= start_epoch`` whose lowest pseudo-Dice is below ``threshold``
    (a NaN Dice, e.g. a structure absent from the validation patches, does not count).

    >>> collapsed_epochs([[0.0, 0.0]] * 10 + [[0.9, 0.01], [0.9, 0.8], [float("nan"), 0.7]])
    1
    """
    count = 0
    for epoch, dice in enumerate(dice_per_epoch):
        values = np.asarray(dice, dtype=np.float64).reshape(-1)
        values = values[np.isfinite(values)]
        if epoch >= start_epoch and values.size and values.min() < threshold:
            count += 1
    return count


def lost_epochs(dice_per_epoch: Sequence[Sequence[float]], learned: float = LEARNED,
                threshold: float = THRESHOLD) -> int:
    """Number of epochs in which a structure that had already reached a pseudo-Dice of ``learned``
    is below ``threshold`` again: a structure *lost*, as opposed to one not learned yet (small
    structures can stay at 0 for many epochs at a small budget, in every arm).

    >>> lost_epochs([[0.0, 0.0], [0.6, 0.0], [0.01, 0.0], [0.7, 0.02]])
    1
    """
    best = None
    count = 0
    for dice in dice_per_epoch:
        values = np.asarray(dice, dtype=np.float64).reshape(-1)
        if best is None:
            best = np.full(values.shape, -np.inf)
        if values.shape != best.shape:
            continue
        finite = np.isfinite(values)
        if np.any(finite & (best >= learned) & (values < threshold)):
            count += 1
        best = np.where(finite, np.maximum(best, values), best)
    return count


def all_learned(dice: Sequence[float], learned: float = LEARNED) -> bool:
    """True if every structure's pseudo-Dice of one epoch is at least ``learned`` (a NaN Dice, a
    structure absent from that epoch's validation patches, is not held against it; an epoch with
    no finite Dice is not).

    >>> all_learned([0.9, 0.55, float("nan")]), all_learned([0.9, 0.2]), all_learned([float("nan")])
    (True, False, False)
    """
    values = np.asarray(dice, dtype=np.float64).reshape(-1)
    values = values[np.isfinite(values)]
    return bool(values.size) and bool(np.all(values >= learned))


def all_learned_epoch(dice_per_epoch: Sequence[Sequence[float]], learned: float = ALL_LEARNED) -> int | None:
    """The first epoch at whose end every structure's pseudo-Dice was at least ``learned``
    (:func:`all_learned`); None if no epoch had. How much of the budget a run needed to learn
    everything: a late epoch means the budget is tight for that run.

    >>> all_learned_epoch([[0.0, 0.0], [0.5, 0.1], [0.6, 0.3], [0.7, 0.1]]), all_learned_epoch([[0.9, 0.0]])
    (2, None)
    """
    for epoch, dice in enumerate(dice_per_epoch):
        if all_learned(dice, learned):
            return epoch
    return None


def learning_time_line(dice_per_epoch: Sequence[Sequence[float]], num_epochs: int,
                       learned: float = ALL_LEARNED, advice: str = "") -> str:
    """One log line at the end of training: :func:`learning_time_text` of the epoch from which
    every structure had been learned (:func:`all_learned_epoch`), followed by ``advice`` if the
    budget is tight.

    >>> learning_time_line([[0.1, 0.0], [0.5, 0.3]], 4)
    "every structure's pseudo-Dice >= 0.2 from epoch 1 of 4"
    >>> learning_time_line([[0.1, 0.0]] * 3, 4, advice="train longer")
    "every structure's pseudo-Dice >= 0.2 in no epoch of 4: the budget is tight for this run; train longer"
    """
    epoch = all_learned_epoch(dice_per_epoch, learned)
    text = learning_time_text(epoch, num_epochs, learned)
    return text + f"; {advice}" if advice and budget_is_tight(epoch, num_epochs) else text


def learning_time_text(all_learned_at: int | float | None, num_epochs: int, learned: float = ALL_LEARNED) -> str:
    """When a run had learned every structure, and that its budget was tight if that took more
    than half of the ``num_epochs`` (or never happened: None / NaN). One wording for the trainer's
    log and the benchmark's and demo's convergence lines.

    >>> learning_time_text(2, 3)
    "every structure's pseudo-Dice >= 0.2 from epoch 2 of 3: the budget is tight for this run"
    >>> learning_time_text(None, 4) == learning_time_text(float("nan"), 4)
    True
    >>> learning_time_text(None, 4)
    "every structure's pseudo-Dice >= 0.2 in no epoch of 4: the budget is tight for this run"
    """
    known = all_learned_at is not None and np.isfinite(float(all_learned_at))
    text = (f"every structure's pseudo-Dice >= {learned:g} "
            + (f"from epoch {int(all_learned_at)} of {num_epochs}" if known else f"in no epoch of {num_epochs}"))
    return text + (": the budget is tight for this run" if budget_is_tight(all_learned_at, num_epochs) else "")


def budget_is_tight(all_learned_at: int | float | None, num_epochs: int) -> bool:
    """True if every structure was learned only after the first half of ``num_epochs``, or never
    (None / NaN): the split of the robustness benchmark's seeds.

    >>> budget_is_tight(60, 120), budget_is_tight(61, 120), budget_is_tight(None, 120)
    (False, True, True)
    """
    if all_learned_at is None or not np.isfinite(float(all_learned_at)):
        return True
    return float(all_learned_at) > num_epochs / 2


def stability_line(dice_per_epoch: Sequence[Sequence[float]], start_epoch: int = START_EPOCH,
                   threshold: float = THRESHOLD) -> str:
    """One log line, e.g. ``stability: 0 of 30 epochs since epoch 10 with a structure's
    pseudo-Dice below 0.05; 0 epochs with a learned structure lost``."""
    considered = max(0, len(dice_per_epoch) - start_epoch)
    return (f"stability: {collapsed_epochs(dice_per_epoch, start_epoch, threshold)} of {considered} epochs since "
            f"epoch {start_epoch} with a structure's pseudo-Dice below {threshold:g}; "
            f"{lost_epochs(dice_per_epoch, threshold=threshold)} epochs with a learned structure (pseudo-Dice "
            f"once >= {LEARNED:g}) lost")


def pseudo_dice_history(trainer) -> list:
    """The per-epoch pseudo-Dice lists an nnU-Net trainer has logged so far (nnunetv2 2.8's
    ``MetaLogger.get_value(key, step=None)``; older releases keep ``my_fantastic_logging``)."""
    logger = trainer.logger
    if hasattr(logger, "get_value"):
        return list(logger.get_value("dice_per_class_or_region", step=None) or [])
    return list(getattr(logger, "my_fantastic_logging", {}).get("dice_per_class_or_region", []))


def epoch_ranges(epochs: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    runs: list = []
    for e in epochs:
        if runs and e == runs[-1][-1] + 1:
            runs[-1].append(e)
        else:
            runs.append([e])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def erm_phase_line(erm_epochs: Sequence[int], num_epochs: int, never_left: bool, learned: float | None) -> str:
    """One end-of-training log line on the ERM phase of a scheme that has one: which epochs sampled
    uniformly because of it, and whether robust weighting ever ran (a run that never left the phase
    trained as nnU-Net's own trainer does, and must not read as a robust run).

    >>> line = erm_phase_line([0, 1, 2], 3, True, 0.2)
    >>> line[:line.index(";")]
    'the run never left its ERM phase: all 3 epochs sampled uniformly, as nnUNetTrainer samples'
    >>> erm_phase_line([0, 1], 5, False, 0.2)
    'ERM phase (uniform sampling) in epochs 0-1, robust weighting from epoch 2 on'
    """
    if never_left:
        until = (f" (it starts after the first epoch at whose end every structure's pseudo-Dice >= {learned:g})"
                 if learned is not None else "")
        return (f"the run never left its ERM phase: all {num_epochs} epochs sampled uniformly, as nnUNetTrainer "
                f"samples; no robust weighting ran{until}")
    if not erm_epochs:
        return "no epoch in the ERM phase: robust weighting from epoch 0 on"
    return (f"ERM phase (uniform sampling) in epochs {epoch_ranges(erm_epochs)}, robust weighting from epoch "
            f"{max(erm_epochs) + 1} on")
