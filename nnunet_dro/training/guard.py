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

from nnunet_dro.training.stability import LEARNED, THRESHOLD, all_learned, all_learned_epoch, epoch_ranges

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


class ErmPhaseGuard:
    """The ERM phase and the stability guard of one training, built from the adaptive settings
    (:class:`~nnunet_dro.weighting.settings.AdaptiveHardnessSettings`): the one collaborator the
    case-weighting trainer calls at the end of every epoch (:meth:`on_epoch_end`), on ``--c``
    (:meth:`on_resume`) and at the end of training (:meth:`erm_phase_epochs`,
    :meth:`summary_line`), so that the trainer's base reads no setting it does not own
    (:meth:`from_settings` builds it; the constructor takes the values in plain Python).

    - the ERM phase: uniform sampling for the first ``uniform_until`` of the epochs and, with
      ``uniform_until_learned``, until the first epoch at whose end every structure's pseudo-Dice
      is at least that value (the weighting is held uniform until :meth:`release_when_learned`);
    - the guard (``guard``): :func:`replay_guard` over the logged pseudo-Dice, its state put into
      the weighting with :meth:`apply_guard`; after a second back-off the weighting returns with
      its lever (``fraction``) escalated (:meth:`escalated`) when ``guard_escalate`` is on.

    ``host`` is the trainer (nnU-Net's): the phase reads its ``case_weighting``, ``current_epoch``,
    ``num_epochs`` and ``local_rank``, writes with ``print_to_log_file`` and names structures with
    ``_structure_names()``; this class imports nothing of nnU-Net. A scheme with another lever
    (the error set's upweight) subclasses it and overrides :meth:`from_settings`,
    :meth:`escalated`, :meth:`release_when_learned` and :meth:`return_message`.
    """

    def __init__(self, host, *, lever: float, until_learned: float | None = None, until: float = 0.0,
                 guard: bool = False, recover: float = RECOVER, escalate: bool = True) -> None:
        self.host = host
        self.lever = float(lever)
        self.until_learned: float | None = None if until_learned is None else float(until_learned)
        self.until = float(until)
        self.guard, self.recover, self.escalate = bool(guard), float(recover), bool(escalate)
        if self.guard:
            check_guard_settings(LEARNED, THRESHOLD, self.recover)

    @classmethod
    def from_settings(cls, settings, host) -> "ErmPhaseGuard":
        """The phase and guard of ``AdaptiveHardnessSettings``; the lever is the fraction ``f``."""
        return cls(host, lever=settings.fraction, until_learned=settings.uniform_until_learned,
                   until=settings.uniform_until, guard=settings.guard, recover=settings.guard_recover,
                   escalate=settings.guard_escalate)

    def escalated(self, backoffs: int) -> float:
        """The lever in force after ``backoffs`` back-offs."""
        return escalated_fraction(self.lever, backoffs) if self.escalate else self.lever

    # ------------------------------------------------------------------ the trainer's calls
    def on_epoch_end(self, history: Sequence[Sequence[float]]) -> None:
        """End the ERM phase if the epoch that just ended allows it, then the guard's decision."""
        self.release_when_learned(history)
        self.apply_guard(history, announce=True)

    def on_resume(self, history: Sequence[Sequence[float]]) -> None:
        """The guard's state for the next epoch of a resumed run (nothing logged again)."""
        self.apply_guard(history, announce=False)

    # ------------------------------------------------------------------ the ERM phase
    def release_when_learned(self, history: Sequence[Sequence[float]]) -> None:
        """End the ERM phase of ``uniform_until_learned`` once the epoch that just ended had every
        structure learned (every rank logs the same gathered pseudo-Dice, so all release together)."""
        host, threshold = self.host, self.until_learned
        weighting = host.case_weighting
        if threshold is None or weighting is None or not weighting.held_uniform:
            return
        if history and all_learned(history[-1], threshold):
            weighting.release()
            host.print_to_log_file(f"DRO: every structure's pseudo-Dice >= {threshold:g} at epoch "
                                   f"{host.current_epoch - 1}: robust weighting from epoch {host.current_epoch} on")

    def erm_phase_epochs(self, history: Sequence[Sequence[float]]) -> list[int] | None:
        """The epochs the ERM phase sampled uniformly (None when there is none): the first
        ``uniform_until`` of training, and every epoch up to the one at whose end every structure
        was learned (``uniform_until_learned``), or all of them if that never happened."""
        threshold, until = self.until_learned, self.until
        if threshold is None and until <= 0:
            return None
        n = self.host.num_epochs
        epochs = {e for e in range(n) if e / max(1, n) < until}
        if threshold is not None:
            if getattr(self.host.case_weighting, "held_uniform", False):
                epochs |= set(range(n))
            else:
                released_after = all_learned_epoch(history, threshold)
                epochs |= set(range(n if released_after is None else min(n, released_after + 1)))
        return sorted(epochs)

    # ------------------------------------------------------------------ the guard
    def replay(self, history: Sequence[Sequence[float]]) -> tuple[GuardState, list[GuardEvent]]:
        return replay_guard(history, LEARNED, THRESHOLD, self.recover)

    def apply_guard(self, history: Sequence[Sequence[float]], announce: bool) -> None:
        """Put the guard's state for the next epoch into the weighting (a pure function of the
        logged pseudo-Dice, so a resumed run gets the same state) and log the decision taken at the
        end of the epoch that just ended (every rank sees the same gathered pseudo-Dice)."""
        host = self.host
        if not self.guard or host.case_weighting is None:
            return
        state, events = self.replay(history)
        lever = self.escalated(state.backoffs)
        host.case_weighting.set_backoff(state.backed_off, lever)
        if not announce or host.local_rank != 0:
            return
        for event in events:
            if event.epoch == len(history) - 1:
                host.print_to_log_file(self.message(event, lever))

    def summary_line(self, history: Sequence[Sequence[float]], erm: Sequence[int] | None) -> str | None:
        """The end-of-training line of the guard (None without one): back-offs and the epochs
        sampled uniformly, the ERM phase's ``erm`` included."""
        if not self.guard:
            return None
        state, _ = self.replay(history)
        uniform = sorted(set(state.backed_off_epochs) | set(erm or []))
        return (f"DRO guard: {state.backoffs} back-off(s) to uniform sampling, "
                f"{len(uniform)} of {self.host.num_epochs} epochs sampled uniformly"
                + (f" (epochs {epoch_ranges(uniform)}"
                   + (", the ERM phase's included)" if erm else ")") if uniform else ""))

    def _what(self, event: GuardEvent) -> str:
        names = self.host._structure_names()
        return ", ".join(f"{names[i] if i < len(names) else f'structure {i + 1}'} (pseudo-Dice {d:.3f}, best {b:.3f})"
                         for i, d, b in zip(event.structures, event.dice, event.best))

    def _held_uniform(self) -> bool:
        return bool(getattr(self.host.case_weighting, "held_uniform", False))

    def message(self, event: GuardEvent, lever: float) -> str:
        """The log line of a decision; ``lever`` is what the weighting returns with."""
        what = self._what(event)
        if event.kind == "back-off" and self._held_uniform():
            return (f"DRO guard: learned structure lost at epoch {event.epoch}: {what}; back-off {event.backoffs}, "
                    f"inside the ERM phase: sampling stays uniform")
        if event.kind == "back-off":
            return (f"DRO guard: learned structure lost at epoch {event.epoch}: {what}; back-off {event.backoffs}: "
                    f"uniform sampling (ERM) from epoch {event.epoch + 1} until it is back to "
                    f"{self.recover:g} of its best")
        return self.return_message(event, what, lever)

    def return_message(self, event: GuardEvent, what: str, lever: float) -> str:
        if self._held_uniform():
            # recovered inside the ERM phase: sampling stays uniform; saying "robust weighting again"
            # would misread the log of a run that has not left its ERM phase yet
            return (f"DRO guard: recovered at epoch {event.epoch}: {what}; still in the ERM phase (uniform "
                    f"until every structure's pseudo-Dice >= {float(self.until_learned):g}), "
                    f"robust weighting then with f = {lever:g}")
        return (f"DRO guard: recovered at epoch {event.epoch}: {what}; robust weighting again from epoch "
                f"{event.epoch + 1} with f = {lever:g}")
