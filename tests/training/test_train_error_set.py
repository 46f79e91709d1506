"""nnUNetTrainerDROAdaptive_errorSet in-process (nnU-Net's trainer on a tiny preprocessed dataset,
no training steps): the end of the default's ERM phase chooses the set ``nnunet_dro jtt``'s rule
picks from the stale losses, the default's guard backs off and escalates on it, the refresh
variant chooses once more at 70 % of the epochs and only once, the checkpoint restores the set,
and the hardness report and the log name it."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_train_trainer import make_trainer, shut_down

from nnunet_dro.errors import UserError
from nnunet_dro.training import nnUNetTrainerDROAdaptive_errorSet, nnUNetTrainerDROAdaptive_errorSet_refresh70
from nnunet_dro.weighting import choose_error_set
from nnunet_dro.weighting.error_set import error_set_probabilities

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def log_of(trainer) -> str:
    with open(trainer.log_file) as f:
        return f.read()


def test_the_erm_phase_ends_in_the_error_set_and_the_guard_acts_on_it(label_dataset, monkeypatch, tmp_path):
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=nnUNetTrainerDROAdaptive_errorSet)
    path = tmp_path / "checkpoint_latest.pth"
    try:
        w = trainer.case_weighting
        n = w.num_cases
        losses = np.linspace(0.1, 2.0, n)[::-1].copy()  # case 0 the hardest
        w.update(np.arange(n), losses)
        uniform = np.full(n, 1.0 / n)
        for not_yet in ([], [[0.19]], [[float("nan")]]):
            trainer._release_when_learned(not_yet)
            assert w.held_uniform and not w.error_set
        np.testing.assert_allclose(w.probabilities(), uniform)
        trainer.current_epoch = 5  # on_epoch_end has counted epoch 4
        trainer._release_when_learned([[0.1], [0.25]])
        expected = choose_error_set(dict(zip(trainer.dro_case_ids, losses)), 0.2, worst="highest")
        assert [trainer.dro_case_ids[i] for i in w.error_set] == list(expected.cases)
        assert w.fixed_at_epoch == 4 and not w.held_uniform
        fixed = error_set_probabilities(n, w.error_set, 5.0)
        np.testing.assert_allclose(w.probabilities(), fixed)
        assert (f"DRO error set: every structure's pseudo-Dice >= 0.2 at epoch 4: the hardest 20 % by stale loss, "
                f"{len(expected.cases)} of {n} cases, drawn 5 times as often as the others from epoch 5 on: "
                f"{expected.cases[0]} (") in log_of(trainer)
        trainer._release_when_learned([[0.9], [0.0]])  # chosen once: a later dip does not choose again
        assert len(w.choices) == 1

        # the default's guard: uniform while a learned structure is lost, the set back after; a second
        # back-off halves the upweight's distance to 1 (5 -> 3)
        history = [[0.1], [0.25], [0.9], [0.01]]
        trainer._apply_guard(history, announce=True)
        np.testing.assert_allclose(w.probabilities(), uniform)
        history.append([0.6])
        trainer._apply_guard(history, announce=True)
        np.testing.assert_allclose(w.probabilities(), fixed)
        assert "the error set drawn 5 times as often again from epoch 5" in log_of(trainer)
        history += [[0.0], [0.9]]
        trainer._apply_guard(history, announce=True)
        np.testing.assert_allclose(w.probabilities(), error_set_probabilities(n, w.error_set, 3.0))
        assert w.error_set == tuple(trainer.dro_case_ids.index(c) for c in expected.cases)

        trainer.write_hardness_report(redraw_now=False)
        table = pd.read_csv(f"{trainer.output_folder}/dro_hardness.csv")
        assert sorted(table.loc[table["in_error_set"] == 1, "case"]) == list(expected.cases)
        assert (table["error_set_epoch"] == 4).all() and table["draws_since_fixed"].sum() == 0
        trainer.save_checkpoint(str(path))
        saved = w.state_dict()
    finally:
        shut_down(trainer)
    resumed = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=nnUNetTrainerDROAdaptive_errorSet)
    try:
        resumed.load_checkpoint(str(path))
        r = resumed.case_weighting
        assert r.error_set == tuple(saved["error_set"]) and r.choices[0][0] == 4 and not r.held_uniform
        assert "DRO error set: restored, chosen at epoch 4: " + ", ".join(expected.cases) in log_of(resumed)
    finally:
        resumed._close_case_weighting()


def test_the_refresh_variant_chooses_once_more_at_70_percent(label_dataset, monkeypatch):
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=nnUNetTrainerDROAdaptive_errorSet_refresh70)
    try:
        w = trainer.case_weighting
        n = w.num_cases
        trainer.num_epochs = 10  # refresh at the start of epoch ceil(0.7 * 10) = 7
        w.update(np.arange(n), np.arange(n, dtype=float))  # the last case the hardest
        trainer.current_epoch = 2
        trainer._release_when_learned([[0.5]])
        assert w.error_set == (n - 1,)
        w.update(np.arange(n), np.arange(n, dtype=float)[::-1].copy())  # now the first case
        trainer.current_epoch = 6
        trainer.on_train_epoch_start()
        assert len(w.choices) == 1  # not yet
        trainer.current_epoch = 7
        trainer.on_train_epoch_start()
        assert [c[:2] for c in w.choices] == [(1, (n - 1,)), (6, (0,))] and w.fixed_at_epoch == 6
        assert "DRO error set: 70 % of the 10 epochs reached (refresh)" in log_of(trainer)
        trainer.current_epoch = 8
        trainer.on_train_epoch_start()
        assert len(w.choices) == 2  # once more, not at every epoch after
    finally:
        shut_down(trainer)


def test_a_late_erm_phase_gets_no_refresh_and_an_all_tie_cohort_is_refused(label_dataset, monkeypatch):
    trainer = make_trainer(label_dataset, monkeypatch, n_proc_da=0, cls=nnUNetTrainerDROAdaptive_errorSet_refresh70)
    try:
        w = trainer.case_weighting
        n = w.num_cases
        trainer.num_epochs = 10
        w.update(np.arange(n), np.full(n, 0.7))
        trainer.current_epoch = 8
        with pytest.raises(UserError, match=f"{n} of the {n} cases tie at score 0.7 .stale loss."):
            trainer._release_when_learned([[0.5]])
        assert w.held_uniform and not w.error_set  # refused: nothing half-changed
        w.update([0], [0.9])
        trainer._release_when_learned([[0.5]])  # the ERM phase ends after the refresh point
        trainer.current_epoch = 9
        trainer.on_train_epoch_start()
        assert len(w.choices) == 1 and w.error_set == (0,)  # already as fresh as a refresh would be
    finally:
        shut_down(trainer)
