"""The digits class-imbalance experiment: data split, methods, a short run, outputs and the script.

Budget: a few seconds (tiny runs of tens of iterations on 8x8 images).
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nnunet_dro.errors import UserError
from nnunet_dro.lab.experiments import digits
from script_modules import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "digits_imbalance.py"


@pytest.fixture(scope="module")
def split() -> digits.DigitsSplit:
    return digits.load_imbalanced_digits(rare_fraction=0.035)


@pytest.mark.parametrize("fraction, kept", [(0.035, 5), (0.01, 1), (0.001, 1), (0.5, 73), (1.0, 146)])
def test_rare_fraction_is_honoured_and_other_classes_untouched(fraction, kept):
    full = digits.load_imbalanced_digits(rare_fraction=1.0)
    thinned = digits.load_imbalanced_digits(rare_fraction=fraction)
    assert thinned.rare_available == 146
    assert thinned.rare_kept == kept == int((thinned.y_train == 3).sum())
    other = np.arange(10) != 3
    np.testing.assert_array_equal(np.bincount(thinned.y_train, minlength=10)[other],
                                  np.bincount(full.y_train, minlength=10)[other])
    # the test split keeps every class, whatever the fraction
    np.testing.assert_array_equal(thinned.y_test, full.y_test)
    assert np.bincount(thinned.y_test, minlength=10).min() >= 35


def test_split_is_deterministic_and_scaled(split):
    again = digits.load_imbalanced_digits(rare_fraction=0.035)
    np.testing.assert_array_equal(split.x_train, again.x_train)
    assert split.x_train.dtype == np.float32 and split.x_train.shape[1:] == (8, 8)
    assert 0.0 <= split.x_train.min() and split.x_train.max() <= 1.0


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, math.nan])
def test_bad_fraction_is_a_user_error(fraction):
    with pytest.raises(UserError, match="rare fraction"):
        digits.load_imbalanced_digits(rare_fraction=fraction)


def test_unknown_method_is_a_user_error(split):
    with pytest.raises(UserError, match="unknown method.*nope"):
        digits.run_experiment(split, ["erm", "nope"], seeds=[0], iterations=1)


def test_registry_has_the_required_rows():
    for name in ("erm", "dro-is-beta0.1", "dro-is-beta1", "dro-is-beta10", "dro-is-beta100", "dro-beta10"):
        assert name in digits.METHODS
    assert digits.METHODS["dro-is-beta10"].settings["importance_sampling"] is True
    assert digits.METHODS["dro-beta10"].settings["importance_sampling"] is False


def test_dro_method_weighs_against_stale_losses_then_updates(split):
    context = digits.MethodContext(split.num_train, split.y_train, seed=0)
    dro = digits.METHODS["dro-is-beta10"].build(context)
    erm = digits.METHODS["erm"].build(context)
    try:
        idx = dro.sample(4)
        fresh = np.full(4, math.log(10) - 1.0)  # 1 nat easier than the initial stale loss
        weights = dro.weigh(idx, fresh)
        np.testing.assert_allclose(weights, 0.1, rtol=1e-6)  # exp(-10) clipped to w_min
        p = dro.sampling_probabilities()  # the examples just seen became easier: less likely
        unseen = np.setdiff1d(np.arange(split.num_train), idx)
        assert p[idx].max() < 1e-3 * p[unseen].min()  # exp(-beta * 1 nat) = exp(-10)
        np.testing.assert_array_equal(erm.weigh(erm.sample(3), np.ones(3)), np.ones(3))
    finally:
        dro.close()
        erm.close()


def test_short_run_structure_and_paired_initialisation(split):
    torch.set_num_threads(1)
    runs = digits.run_experiment(split, ["erm", "dro-is-beta10"], seeds=[0, 1], iterations=25,
                                 eval_every=10)
    assert [(r.method, r.seed) for r in runs] == [("erm", 0), ("dro-is-beta10", 0),
                                                  ("erm", 1), ("dro-is-beta10", 1)]
    for run in runs:
        np.testing.assert_array_equal(run.iterations, [0, 10, 20, 25])
        for curve in (run.accuracy, run.rare_accuracy):
            assert np.all((curve >= 0) & (curve <= 1))
        assert np.all(np.isfinite(run.train_loss)) and np.all(run.train_loss > 0)
        assert np.all((run.rare_mass > 0) & (run.rare_mass < 1))
    # same seed = same initial network for every method (paired comparison)
    assert runs[0].accuracy[0] == runs[1].accuracy[0]
    assert runs[0].train_loss[0] == runs[1].train_loss[0]
    # ERM samples uniformly: its mass on the rare digit is exactly kept / n
    np.testing.assert_allclose(runs[0].rare_mass, split.rare_kept / split.num_train)

    summary = digits.summarise(runs)
    assert list(summary.method) == ["erm", "dro-is-beta10"]
    assert summary.loc[summary.method == "erm", "rare_gain_vs_erm"].item() == 0.0
    assert (summary.seeds == 2).all()
    assert {"rare_acc_mean", "rare_acc_std", "acc_mean", "acc_std"} <= set(summary.columns)


@pytest.mark.parametrize("argv, flag", [(["--rare-fraction", "0"], "--rare-fraction"),
                                        (["--rare-fraction", "1.5"], "--rare-fraction"),
                                        (["--iterations", "0"], "--iterations"),
                                        (["--lr", "-1"], "--lr"),
                                        (["--methods", "nope"], "--methods"),
                                        (["--rare-class", "11"], "--rare-class")])
def test_script_rejects_bad_input_before_any_work(argv, flag, tmp_path, capsys):
    script = load_script("digits_imbalance")
    with pytest.raises(SystemExit) as exit_info:
        script.main([*argv, "-o", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_script_end_to_end_in_a_subprocess(tmp_path):
    out = tmp_path / "digits"
    done = subprocess.run([sys.executable, str(SCRIPT), "--methods", "erm", "dro-beta10", "--seeds", "3",
                           "--iterations", "12", "--eval-every", "6", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "kept 5 of 146 training images of digit 3" in done.stdout
    assert "| dro-beta10 | 10 | off |" in done.stdout
    for name in ("summary.csv", "summary.md", "runs.csv", "curves.csv", "learning_curves.png"):
        assert (out / name).stat().st_size > 0
    assert "| dro-beta10 | 10 | off |" in (out / "summary.md").read_text()
    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((out / "runs.csv").read_text().splitlines()) == 1 + 2  # header + 2 methods x 1 seed
    assert not list(out.glob(".*.tmp"))  # nothing half-written left behind
