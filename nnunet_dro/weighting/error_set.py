"""Just Train Twice's error set inside one training (no nnU-Net, no torch).

:func:`choose_error_set` is the one rule that picks JTT's error set, used by ``nnunet_dro jtt``
(:mod:`nnunet_dro.workflows.jtt`, from a finished ERM training's per-case Dice) and by
:class:`ErrorSetWeighting` (from the stale per-case losses at the end of an ERM phase): the
``ceil(fraction * n)`` worst cases and every case tied with the last of them, refused when the
tie would take in every case.

:class:`ErrorSetWeighting` draws uniformly (ERM) while it is held, then, once :meth:`fix
<ErrorSetWeighting.fix>` has chosen the error set from the stale losses, draws each error-set
case ``upweight`` times as often as any other, fixed until the end (Liu et al., "Just Train
Twice: Improving Group Robustness without Training Group Information", ICML 2021,
arXiv:2107.09044: their ``lambda_up``, in one training instead of two). Step weights are 1. The
draw distribution lives in the sum tree of a
:class:`~nnunet_dro.sampling.HardnessWeightedSampler` over ``log w`` with beta 1 (as
:class:`~nnunet_dro.weighting.FixedWeighting` does), so data-loading workers in other processes
follow a new set at once.

The stale losses start as "never drawn" (no value, no random tie-breaking noise), and every rank
of a distributed run folds in the same all-gathered losses, so every rank chooses the same set
from the same vector: a never-drawn case counts as the hardest (nothing says it is fitted, as the
default's ``L_init`` says), identically everywhere.

>>> w = ErrorSetWeighting(5, upweight=5.0, seed=0)
>>> w.update([0, 1, 2, 3, 4], [0.1, 0.9, 0.2, 0.3, 0.4])
>>> w.fix(0.2, epoch=3).cases, w.probabilities().round(4).tolist()
((1,), [0.1111, 0.5556, 0.1111, 0.1111, 0.1111])
>>> w.close()
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from nnunet_dro.errors import UserError
from nnunet_dro.sampling.hardness import NO_IMPORTANCE, HardnessWeightedSampler
from nnunet_dro.weighting.base import CaseWeighting, LatestLosses, SumTreeDraws, check_batch

STATE_VERSION = 1
#: scores this close are a tie (Dice in percent from voxel counts: equal cases are equal to the last digit;
#: two per-case losses equal to 1e-9 are as equal as float32 network outputs can tell)
TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ErrorSetChoice:
    """The error set (``cases``, in sorted order), the cases tied at its boundary when the tie
    crosses it (else empty), ``asked`` = ``ceil(fraction * n)`` and the ``boundary`` score."""

    cases: tuple
    tied: tuple
    asked: int
    boundary: float


def choose_error_set(scores: Mapping[Hashable, float] | Iterable[tuple[Hashable, float]], fraction: float, *,
                     worst: str = "lowest", what: str = "score",
                     why: str = "the scores do not separate the cases") -> ErrorSetChoice:
    """The ``ceil(fraction * n)`` cases with the worst scores (``worst``: ``"lowest"`` for a Dice,
    ``"highest"`` for a loss; ``inf`` counts too) and every case tied with the last of them.

    Ranked by (score, case), so the ``asked`` worst are the same whatever the input order; every
    tied case is in, so the set can be larger than asked. Refused (:class:`~nnunet_dro.errors.UserError`)
    when the tie at the boundary would take in every case: that is no error set.

    >>> choose_error_set({"a": 0.0, "b": 0.0, "c": 0.0, "d": 80.0}, 0.5)
    ErrorSetChoice(cases=('a', 'b', 'c'), tied=('a', 'b', 'c'), asked=2, boundary=0.0)
    >>> choose_error_set({0: 0.2, 1: 0.9, 2: 0.5}, 0.3, worst="highest").cases
    (1,)
    >>> choose_error_set({"a": 1.0, "b": 1.0}, 0.5, what="stale loss")
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: 2 of the 2 cases tie at score 1 (stale loss) at the boundary of the error set: with every tied case in it, every case would be upweighted, which is no error set; the scores do not separate the cases
    """
    if worst not in ("lowest", "highest"):
        raise ValueError(f"worst must be 'lowest' or 'highest', got {worst!r}")
    if isinstance(fraction, bool) or not (0.0 < float(fraction) < 1.0):
        raise ValueError(f"fraction must lie strictly between 0 and 1, got {fraction!r}")
    items = list(scores.items()) if hasattr(scores, "items") else [(c, s) for c, s in scores]  # a dict or a Series
    if not items:
        raise ValueError("no case to rank")
    sign = 1.0 if worst == "lowest" else -1.0
    if any(math.isnan(float(s)) for _, s in items):
        raise ValueError("a score is NaN: rank only cases with a score")
    ranked = sorted(((sign * float(s), c) for c, s in items), key=lambda item: (item[0], item[1]))
    asked = math.ceil(float(fraction) * len(ranked))
    boundary = ranked[asked - 1][0]

    def ties(score: float) -> bool:  # exact equality first: inf - inf is NaN
        return score == boundary or abs(score - boundary) <= TIE_TOLERANCE

    chosen = [case for score, case in ranked if score <= boundary or ties(score)]
    tied = [case for score, case in ranked if ties(score)]
    if len(chosen) == len(ranked) and asked < len(ranked):
        raise UserError(f"{len(tied)} of the {len(ranked)} cases tie at score {sign * boundary:g} ({what}) at the "
                        f"boundary of the error set: with every tied case in it, every case would be upweighted, "
                        f"which is no error set; {why}")
    crosses = len(chosen) > asked
    return ErrorSetChoice(tuple(sorted(chosen)), tuple(sorted(tied)) if crosses else (), asked, sign * boundary)


def error_set_probabilities(num_cases: int, cases: Sequence[int], upweight: float) -> NDArray[np.float64]:
    """Each case's draw probability: ``upweight / Z`` for the error set, ``1 / Z`` for the others.

    >>> error_set_probabilities(4, [2], 5.0).tolist()
    [0.125, 0.125, 0.625, 0.125]
    """
    w = np.ones(int(num_cases), dtype=np.float64)
    w[np.asarray(list(cases), dtype=np.int64)] = float(upweight)
    return w / w.sum()


class ErrorSetWeighting(SumTreeDraws, LatestLosses, CaseWeighting):
    """Uniform draws until :meth:`fix`, then the error set drawn ``upweight`` times as often; step weights 1.

    Args:
        num_cases: number of training cases ``n``.
        upweight: ``lambda >= 1``, how many times as often an error-set case is drawn.
        seed: seed of the draws (other processes derive their own streams from it).
        shared: keep the draw state in shared memory (for data-loading worker processes).

    :meth:`set_backoff` is the stability guard's lever (uniform draws while backed off, and the
    upweight the set returns with); the set itself never changes there. Everything is in
    :meth:`state_dict`, so a resumed run draws the same set with the same weights.
    """

    scheme = "error_set"
    held_uniform = True

    def __init__(self, num_cases: int, upweight: float = 5.0, seed: int | None = None, shared: bool = False):
        super().__init__(num_cases)
        if isinstance(upweight, bool) or not (math.isfinite(float(upweight)) and float(upweight) >= 1.0):
            raise ValueError(f"upweight must be a finite number >= 1, got {upweight!r}")
        self.upweight = float(upweight)
        self.upweight_in_force = self.upweight
        self.held_uniform = True
        self.backed_off = False
        self.error_set: tuple[int, ...] = ()
        #: every choice so far: (epoch, cases, tied, asked), the last one in force
        self.choices: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = []
        self._init_latest(self.num_cases)
        self._draws_since_fixed = np.zeros(self.num_cases, dtype=np.int64)
        self.sampler = HardnessWeightedSampler(self.num_cases, beta=1.0, init_loss=np.zeros(self.num_cases),
                                               importance=NO_IMPORTANCE, seed=seed, shared=shared)

    # -------------------------------------------------------------- the training loop
    def update(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> None:
        idx, fresh = check_batch(indices, losses, self.num_cases)
        finite = self._record_latest(idx, fresh)
        if self.error_set:
            np.add.at(self._draws_since_fixed, idx[finite], 1)

    # -------------------------------------------------------------- the error set
    def selection_losses(self) -> NDArray[np.float64]:
        """The stale loss the set is chosen by: the latest finite loss, ``inf`` for a case never drawn."""
        return np.where(self._counts > 0, self._losses, np.inf)

    def fix(self, fraction: float, epoch: int) -> ErrorSetChoice:
        """Choose the error set (the hardest ``fraction`` by :meth:`selection_losses`, ties included)
        and draw it ``upweight`` times as often from the next draw on (ends the uniform hold)."""
        choice = choose_error_set(dict(enumerate(self.selection_losses().tolist())), fraction, worst="highest",
                                  what="stale loss", why="the stale losses do not separate the cases")
        self.set_error_set(choice.cases, epoch, choice.tied, choice.asked)
        return choice

    def set_error_set(self, cases: Sequence[int], epoch: int, tied: Sequence[int] = (), asked: int | None = None) -> None:
        """Put this set in force (e.g. rank 0's, broadcast to the other ranks)."""
        chosen = tuple(sorted(int(c) for c in cases))
        if not chosen or chosen[0] < 0 or chosen[-1] >= self.num_cases or len(set(chosen)) != len(chosen):
            raise ValueError(f"an error set must hold distinct case indices in [0, {self.num_cases}), got {chosen}")
        self.error_set = chosen
        self.choices.append((int(epoch), chosen, tuple(int(c) for c in tied), len(chosen) if asked is None
                             else int(asked)))
        self._draws_since_fixed[:] = 0
        self.held_uniform = False
        self._put_in_force()

    @property
    def fixed_at_epoch(self) -> int | None:
        """The epoch at whose end the set in force was chosen (None: not yet)."""
        return self.choices[-1][0] if self.choices else None

    def in_error_set(self) -> NDArray[np.bool_]:
        mask = np.zeros(self.num_cases, dtype=bool)
        mask[list(self.error_set)] = True
        return mask

    def draw_shares(self) -> NDArray[np.float64]:
        """Each case's share of the draws since the set in force was chosen (NaN before any)."""
        total = self._draws_since_fixed.sum()
        return self._draws_since_fixed / total if total else np.full(self.num_cases, np.nan)

    @property
    def draws_since_fixed(self) -> NDArray[np.int64]:
        return self._draws_since_fixed.copy()

    def set_backoff(self, backed_off: bool, upweight: float | None = None) -> bool:
        """Draw uniformly (``backed_off``) or not, and set the upweight the set is drawn with
        (None: unchanged). Returns True if anything changed."""
        upweight = self.upweight_in_force if upweight is None else float(upweight)
        if not (math.isfinite(upweight) and upweight >= 1.0):
            raise ValueError(f"upweight must be a finite number >= 1, got {upweight}")
        changed = bool(backed_off) != self.backed_off or upweight != self.upweight_in_force
        if changed:
            self.backed_off, self.upweight_in_force = bool(backed_off), upweight
            self._put_in_force()
        return changed

    def _log_weights(self) -> NDArray[np.float64]:
        log_w = np.zeros(self.num_cases, dtype=np.float64)
        if self.error_set and not (self.held_uniform or self.backed_off):
            log_w[list(self.error_set)] = math.log(self.upweight_in_force)
        return log_w

    def _put_in_force(self) -> None:
        # the sum tree's "losses" are log w at beta 1; written to shared memory, so the workers
        # draw from the new weights at their next batch
        self.sampler.update(np.arange(self.num_cases), self._log_weights())

    # -------------------------------------------------------------- reports
    def probabilities(self) -> NDArray[np.float64]:
        w = np.exp(self._log_weights())
        return w / w.sum()

    def epoch_stats(self, k: int = 5) -> dict[str, Any]:
        return {**super().epoch_stats(k), "backed_off": self.backed_off}

    def describe(self) -> str:
        text = (f"JTT's error set inside one training: uniform sampling (ERM) until released, then the error set "
                f"drawn {self.upweight:g} times as often as the other cases, fixed; step weights 1")
        if self.error_set:
            text += f"; error set of {len(self.error_set)} case(s) chosen at epoch {self.fixed_at_epoch}"
        if self.backed_off:
            text += "; backed off to uniform sampling (ERM) by the stability guard"
        return text

    # -------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "scheme": self.scheme, "upweight": self.upweight,
                "upweight_in_force": self.upweight_in_force, "held_uniform": self.held_uniform,
                "backed_off": self.backed_off, "error_set": list(self.error_set),
                "choices": [[e, list(c), list(t), a] for e, c, t, a in self.choices],
                "losses": self._losses.copy(), "draw_counts": self._counts.copy(),
                "draws_since_fixed": self._draws_since_fixed.copy(), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["sampler"]["num_cases"]) != self.num_cases:
            raise ValueError(f"the state is for {state['sampler']['num_cases']} cases, this weighting has "
                             f"{self.num_cases}")
        if float(state["upweight"]) != self.upweight:
            raise ValueError(f"the checkpoint was trained with upweight {state['upweight']:g}, this trainer uses "
                             f"{self.upweight:g}; resume with the trainer that wrote it")
        self._losses = np.asarray(state["losses"], dtype=np.float64).copy()
        self._counts = np.asarray(state["draw_counts"], dtype=np.int64).copy()
        self._draws_since_fixed = np.asarray(state["draws_since_fixed"], dtype=np.int64).copy()
        self.choices = [(int(e), tuple(int(i) for i in c), tuple(int(i) for i in t), int(a))
                        for e, c, t, a in state["choices"]]
        self.error_set = tuple(int(i) for i in state["error_set"])
        self.held_uniform = bool(state["held_uniform"])
        self.backed_off = bool(state["backed_off"])
        self.upweight_in_force = float(state["upweight_in_force"])
        self.sampler.load_state_dict(state["sampler"])
        self._put_in_force()  # the sum tree from the restored set (the saved tree says the same)

    def close(self) -> None:
        self.sampler.close()
