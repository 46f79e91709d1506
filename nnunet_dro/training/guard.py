"""The stability guard: back off to uniform sampling while a learned structure is lost.

On small cohorts (tens of training cases) robust weighting can steer the optimiser away from a
structure the network had already learned: nnU-Net's online pseudo-Dice of that structure falls
from a learned value to about 0, sometimes again and again. The guard watches that signal, once
per epoch, and answers with the one setting known to learn every structure, ERM:

- **back-off**: at the end of an epoch in which a structure that had reached a pseudo-Dice of
  ``learned`` (0.5) is below ``lost`` (0.05), the next epochs sample uniformly (weights 1);
- **return**: at the end of the first epoch in which every structure lost so far is back to at
  least ``recover`` times the best pseudo-Dice it had before it was lost, robust weighting
  resumes from the next epoch;
- **escalation** (optional): a run that needs a second back-off is one whose weighting itself is
  too strong for it, so after the ``k``-th back-off (``k >= 2``) the weighting returns with its
  fraction ``f`` moved ``1 - 2^-(k-1)`` of the way to 1 (uniform): 0.5 -> 0.75 -> 0.875 ...
  A single back-off, e.g. in the start-up epochs where ERM loses structures too, changes nothing
  after its return.

The guard's state is a pure function of the logged pseudo-Dice (:func:`replay_guard`), which
nnU-Net keeps in its checkpoint: a run resumed with ``--c`` is in the same state as one that never
stopped. Nothing here knows nnU-Net or torch; a NaN pseudo-Dice (a structure absent from an
epoch's validation patches) is no evidence either way.

>>> state, events = replay_guard([[0.9, 0.7], [0.9, 0.01], [0.9, 0.6], [0.9, 0.8]])
>>> [(e.epoch, e.kind, e.structures) for e in events]
[(1, 'back-off', (1,)), (2, 'return', (1,))]
>>> state.backed_off, state.backoffs, state.backed_off_epochs
(False, 1, (2,))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nnunet_dro.training.stability import LEARNED, THRESHOLD

#: a lost structure counts as recovered at this fraction of the best pseudo-Dice it had reached
RECOVER = 0.5


@dataclass(frozen=True)
class GuardEvent:
    """A decision taken at the end of ``epoch``: ``kind`` is ``"back-off"`` (uniform sampling from
    the next epoch) or ``"return"`` (robust weighting from the next epoch); ``structures`` are the
    indices of the structures concerned, ``dice`` their pseudo-Dice at that epoch and ``best`` the
    best each had reached before it was lost; ``backoffs`` counts back-offs so far."""

    epoch: int
    kind: str
    structures: tuple[int, ...]
    dice: tuple[float, ...]
    best: tuple[float, ...]
    backoffs: int


@dataclass(frozen=True)
class GuardState:
    """Where the guard stands after the epochs it has seen: ``backed_off`` (the next epoch samples
    uniformly), ``backoffs`` (how many so far), ``watched`` (lost structures not recovered yet) and
    ``backed_off_epochs`` (the epochs that were trained under a back-off)."""

    backed_off: bool = False
    backoffs: int = 0
    watched: tuple[int, ...] = ()
    backed_off_epochs: tuple[int, ...] = ()


def check_guard_settings(learned: float, lost: float, recover: float) -> None:
    """Raise ValueError unless ``0 <= lost < learned <= 1`` and ``0 < recover <= 1``."""
    if not (0.0 <= lost < learned <= 1.0):
        raise ValueError(f"the guard needs 0 <= lost < learned <= 1, got lost={lost!r}, learned={learned!r}")
    if not (0.0 < recover <= 1.0):
        raise ValueError(f"the guard's recover fraction must lie in (0, 1], got {recover!r}")


def replay_guard(dice_per_epoch: Sequence[Sequence[float]], learned: float = LEARNED, lost: float = THRESHOLD,
                 recover: float = RECOVER) -> tuple[GuardState, list[GuardEvent]]:
    """Replay the guard over the pseudo-Dice of every epoch so far (one list per epoch, one value
    per structure); returns the state after the last epoch and every decision taken.

    An epoch whose number of values differs from the first epoch's is skipped (as
    :func:`~nnunet_dro.training.stability.lost_epochs` does).

    >>> replay_guard([[0.2], [0.0], [0.3]])[0].backoffs   # never learned: nothing to lose
    0
    >>> state, events = replay_guard([[0.8], [0.0], [float("nan")], [0.3], [0.5]])
    >>> [(e.epoch, e.kind) for e in events], state.backed_off_epochs
    ([(1, 'back-off'), (4, 'return')], (2, 3, 4))
    """
    check_guard_settings(learned, lost, recover)
    best: np.ndarray | None = None
    backed_off, backoffs = False, 0
    targets: dict[int, float] = {}   # watched structure -> best pseudo-Dice before it was lost
    under_backoff: list[int] = []
    events: list[GuardEvent] = []
    for epoch, dice in enumerate(dice_per_epoch):
        values = np.asarray(dice, dtype=np.float64).reshape(-1)
        if best is None:
            best = np.full(values.shape, -np.inf)
        if backed_off:
            under_backoff.append(epoch)
        if values.shape != best.shape:
            continue
        finite = np.isfinite(values)
        newly_lost = [int(i) for i in np.flatnonzero(finite & (best >= learned) & (values < lost)) if i not in targets]
        if newly_lost:
            for i in newly_lost:
                targets[i] = float(best[i])
            if not backed_off:
                backed_off, backoffs = True, backoffs + 1
                events.append(GuardEvent(epoch, "back-off", tuple(newly_lost), tuple(float(values[i]) for i in newly_lost),
                                         tuple(targets[i] for i in newly_lost), backoffs))
        elif backed_off and all(finite[i] and values[i] >= recover * targets[i] for i in targets):
            watched = tuple(sorted(targets))
            events.append(GuardEvent(epoch, "return", watched, tuple(float(values[i]) for i in watched),
                                     tuple(targets[i] for i in watched), backoffs))
            backed_off = False
            targets = {}
        best = np.where(finite, np.maximum(best, values), best)
    return GuardState(backed_off, backoffs, tuple(sorted(targets)), tuple(under_backoff)), events


def escalated_fraction(fraction: float, backoffs: int) -> float:
    """The fraction ``f`` the weighting returns with after ``backoffs`` back-offs: unchanged after
    one, then halfway to 1 at each further back-off.

    >>> [escalated_fraction(0.5, k) for k in range(4)]
    [0.5, 0.5, 0.75, 0.875]
    """
    return 1.0 - (1.0 - float(fraction)) * 0.5 ** max(0, int(backoffs) - 1)


def escalated_upweight(upweight: float, backoffs: int) -> float:
    """The error set's upweight ``lambda`` after ``backoffs`` back-offs, by the same rule as
    :func:`escalated_fraction`: unchanged after one, then its distance to 1 (uniform) halved at
    each further back-off.

    >>> [escalated_upweight(5.0, k) for k in range(4)]
    [5.0, 5.0, 3.0, 2.0]
    """
    return 1.0 + (float(upweight) - 1.0) * 0.5 ** max(0, int(backoffs) - 1)
