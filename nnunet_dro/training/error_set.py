"""JTT's error set inside one training: ``nnUNetTrainerDROAdaptive_errorSet``.

Just Train Twice (Liu et al., ICML 2021, arXiv:2107.09044) trains ERM, takes the training cases it
fits worst (the error set) and trains again with them drawn ``lambda`` times as often: two
trainings. This trainer does both in one: its ERM phase is the default's (uniform sampling until
every structure's pseudo-Dice is at least 0.2, the same stability guard); at the end of that phase
the error set is the hardest ``error_fraction`` (0.2) of the training cases by their stale
per-case loss, ties at the boundary included by the rule of ``nnunet_dro jtt``
(:func:`~nnunet_dro.weighting.error_set.choose_error_set`); from the next epoch on every error-set
case is drawn ``upweight`` (5) times as often as the others, fixed until the end. Why fixed: in
the record's decision regime JTT's fixed set held the rare cases on every seed while the default's
moving weights held fewer of them (issue "JTT inside one training").

The set is chosen on every rank from the same all-gathered stale losses, and in a distributed
run rank 0's set is broadcast and put in force everywhere, so the ranks cannot disagree. The set,
the epoch it was chosen at and each case's share of the draws since then are in the log, in
``dro_hardness.csv`` (``in_error_set, error_set_epoch, draws_since_fixed, draw_share``) and in the checkpoint
(``dro_state['error_set']``; ``--c`` resumes with the same set).

``nnUNetTrainerDROAdaptive_errorSet_refresh70`` (a variant) chooses the set once more at the start
of the epoch at 70 % of the schedule, from the stale losses then.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np
import pandas as pd

from nnunet_dro.sampling.distributed import broadcast_indices
from nnunet_dro.training.guard import RECOVER, ErmPhaseGuard, GuardEvent, escalated_upweight
from nnunet_dro.training.stability import ALL_LEARNED, all_learned
from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive
from nnunet_dro.weighting.error_set import ErrorSetChoice, error_set_probabilities
from nnunet_dro.weighting.settings import ErrorSetSettings


class ErrorSetPhaseGuard(ErmPhaseGuard):
    """The default's ERM phase and stability guard on the error set: the end of the ERM phase
    chooses the set (the host's ``_choose_error_set``), and backed off the draws are uniform; an
    escalation halves the upweight's distance to 1 instead of moving ``f``."""

    @classmethod
    def from_settings(cls, settings: ErrorSetSettings, host) -> "ErrorSetPhaseGuard":
        return cls(host, lever=settings.upweight, until_learned=settings.uniform_until_learned,
                   guard=settings.guard, recover=settings.guard_recover, escalate=settings.guard_escalate)

    def escalated(self, backoffs: int) -> float:
        return escalated_upweight(self.lever, backoffs) if self.escalate else self.lever

    def release_when_learned(self, history: list) -> None:
        """The end of the ERM phase (the default's rule) chooses the error set from the stale losses."""
        host = self.host
        weighting = host.case_weighting
        if weighting is None or not weighting.held_uniform:
            return
        threshold = self.until_learned
        if history and all_learned(history[-1], threshold):
            ended = host.current_epoch - 1  # on_epoch_end has already counted the epoch that just ended
            host._choose_error_set(ended, f"every structure's pseudo-Dice >= {threshold:g} at epoch {ended}")

    def return_message(self, event: GuardEvent, what: str, upweight: float) -> str:
        if self.host.case_weighting.held_uniform:
            return (f"DRO guard: recovered at epoch {event.epoch}: {what}; still in the ERM phase (uniform until "
                    f"every structure's pseudo-Dice >= {self.until_learned:g})")
        return (f"DRO guard: recovered at epoch {event.epoch}: {what}; the error set drawn {upweight:g} times as "
                f"often again from epoch {event.epoch + 1}")


class nnUNetTrainerDROAdaptive_errorSet(nnUNetTrainerDROAdaptive):
    """The default's ERM phase and stability guard; then JTT's error set (the hardest 20 % of the
    training cases by stale loss, ties included) drawn 5 times as often as the other cases, fixed
    until the end; step weights 1. See the module docstring."""

    dro_settings = ErrorSetSettings(error_fraction=0.2, upweight=5.0, uniform_until_learned=ALL_LEARNED,
                                    guard=True, guard_recover=RECOVER, guard_escalate=True)

    def build_dro_phase(self) -> ErrorSetPhaseGuard:
        """The default's ERM phase and guard, on the error set (:class:`ErrorSetPhaseGuard`)."""
        return ErrorSetPhaseGuard.from_settings(self.dro_settings, self)

    # ------------------------------------------------------------------ choosing the set
    def _refresh_epoch(self) -> Optional[int]:
        """The first epoch at or after ``refresh_at`` of the schedule (None: no refresh)."""
        at = self.dro_settings.refresh_at
        return None if at is None else math.ceil(float(at) * self.num_epochs)

    def on_train_epoch_start(self):
        super().on_train_epoch_start()
        refresh, weighting = self._refresh_epoch(), self.case_weighting
        # once: a set chosen at or after the refresh point is already as fresh as the refresh would be
        if refresh is not None and self.current_epoch >= refresh and len(weighting.choices) == 1 \
                and weighting.choices[0][0] < refresh - 1:
            self._choose_error_set(self.current_epoch - 1, f"{100 * self.dro_settings.refresh_at:g} % of the "
                                                            f"{self.num_epochs} epochs reached (refresh)")

    def _choose_error_set(self, epoch: int, why: str) -> None:
        weighting = self.case_weighting
        choice = weighting.fix(float(self.dro_settings.error_fraction), epoch)
        if self.is_ddp:
            # rank 0's set everywhere: the stale losses are the same gathered values on every rank,
            # and this makes the agreement hold by construction, whatever a rank's own state says
            agreed = tuple(int(i) for i in broadcast_indices(choice.cases))
            if agreed != choice.cases:
                weighting.choices.pop()
                weighting.set_error_set(agreed, epoch, asked=choice.asked)
                self.print_to_log_file(f"DRO: rank {self.local_rank} had chosen another error set than rank 0; "
                                       f"rank 0's is in force")
                choice = ErrorSetChoice(agreed, (), choice.asked, choice.boundary)
        self.print_to_log_file(self._choice_line(choice, epoch, why))

    def _choice_line(self, choice: ErrorSetChoice, epoch: int, why: str) -> str:
        ids, losses = self.dro_case_ids, self.case_weighting.selection_losses()
        settings = self.dro_settings
        text = (f"DRO error set: {why}: the hardest {100 * float(settings.error_fraction):g} % by stale loss, "
                f"{len(choice.cases)} of {len(ids)} cases, drawn {float(settings.upweight):g} times as often as the "
                f"others from epoch {epoch + 1} on: "
                + ", ".join(f"{ids[i]} ({losses[i]:.4f})" for i in choice.cases))
        if choice.tied:
            text += (f"; {len(choice.tied)} cases tie at the boundary ({', '.join(ids[i] for i in choice.tied)}): all "
                     f"are in, {len(choice.cases)} instead of {choice.asked}")
        return text

    # ------------------------------------------------------------------ reports and state
    def _hardness_table(self):
        w = self.case_weighting
        by_case = dict(zip(self.dro_case_ids, zip(w.in_error_set().astype(int), w.draws_since_fixed,
                                                  w.draw_shares())))
        table = super()._hardness_table()
        table["in_error_set"] = [by_case[c][0] for c in table["case"]]
        # the same on every row: the CSV alone says from when the set was in force (empty: not yet)
        table["error_set_epoch"] = pd.array([w.fixed_at_epoch] * len(table), dtype="Int64")
        table["draws_since_fixed"] = [by_case[c][1] for c in table["case"]]
        table["draw_share"] = [by_case[c][2] for c in table["case"]]
        return table

    def _error_set_record(self) -> Dict[str, Any]:
        """What ``dro_state['error_set']`` holds (case names; the weighting's state has the indices)."""
        w, ids = self.case_weighting, self.dro_case_ids
        return {"cases": [ids[i] for i in w.error_set], "fixed_at_epoch": w.fixed_at_epoch,
                "error_fraction": float(self.dro_settings.error_fraction), "upweight": float(self.dro_settings.upweight),
                "choices": [{"epoch": e, "cases": [ids[i] for i in c], "tied": [ids[i] for i in t], "asked": a}
                            for e, c, t, a in w.choices],
                "draw_share": dict(zip(ids, w.draw_shares().tolist()))}

    def _dro_state(self) -> Optional[Dict[str, Any]]:
        state = super()._dro_state()
        if state is not None and self.case_weighting is not None:
            state["error_set"] = self._error_set_record()
        return state

    def _restore_extra_checkpoint_state(self, state, checkpoint, source) -> None:
        super()._restore_extra_checkpoint_state(state, checkpoint, source)
        w = self.case_weighting
        if w.error_set:
            self.print_to_log_file(f"DRO error set: restored, chosen at epoch {w.fixed_at_epoch}: "
                                   + ", ".join(self.dro_case_ids[i] for i in w.error_set))

    def on_train_end(self):
        w = self.case_weighting
        if self.local_rank == 0 and w is not None:
            if not w.error_set:
                self.print_to_log_file("DRO error set: none chosen (the ERM phase never ended): this run trained "
                                       "as ERM")
            else:
                shares = w.draw_shares()
                order = np.argsort(-np.nan_to_num(shares, nan=-1.0), kind="stable")
                self.print_to_log_file(
                    f"DRO error set: chosen at epoch {w.fixed_at_epoch}, {len(w.error_set)} of {w.num_cases} cases; "
                    f"share of the {int(w.draws_since_fixed.sum())} draws since then (* in the set; the fixed weights "
                    f"give {error_set_probabilities(w.num_cases, w.error_set, w.upweight).max():.4f} to each case in "
                    f"the set, uniform while the guard backs off): "
                    + ", ".join(f"{self.dro_case_ids[i]}{'*' if i in w.error_set else ''} {shares[i]:.4f}"
                                for i in order))
        super().on_train_end()
