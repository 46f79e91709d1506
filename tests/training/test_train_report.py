"""The hardness report files (csv and png), written atomically."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from nnunet_dro.training.hardness_report import RedrawPacer, hardness_table, plot_dro_progress, write_hardness_csv


def test_csv_has_one_row_per_case_hardest_first_and_round_trips(tmp_path):
    table = hardness_table(["a", "b", "c"], [0.1, 0.7, 0.3], [0.2, 0.5, 0.3], [4, 0, 2])
    path = tmp_path / "dro_hardness.csv"
    write_hardness_csv(path, table)
    back = pd.read_csv(path)
    assert list(back.columns) == ["case", "stale_loss", "probability", "times_drawn"]
    assert back["case"].tolist() == ["b", "c", "a"]
    np.testing.assert_allclose(back["stale_loss"], [0.7, 0.3, 0.1])
    assert back["times_drawn"].tolist() == [0, 2, 4]
    assert [p.name for p in tmp_path.iterdir()] == ["dro_hardness.csv"]  # no temporary left behind


@pytest.mark.parametrize("bad", [
    dict(case_ids=["a"], stale_losses=[0.1, 0.2], probabilities=[1.0], times_drawn=[1]),
    dict(case_ids=["a", "b"], stale_losses=[0.1, 0.2], probabilities=[1.0], times_drawn=[1, 1]),
])
def test_mismatched_lengths_are_refused(bad):
    with pytest.raises(ValueError, match="same length"):
        hardness_table(**bad)


@pytest.mark.parametrize("epochs,clipped", [(0, []), (1, [0.25]), (3, [math.nan] * 3)],
                         ids=["no-epoch-yet", "one-epoch", "importance-sampling-off"])
def test_progress_png_is_written_for_edge_histories(tmp_path, epochs, clipped):
    history = {"epoch": list(range(epochs)), "entropy": [1.0] * epochs, "effective_sample_size": [3.0] * epochs,
               "max_probability": [0.5] * epochs, "clipped_fraction": clipped}
    path = tmp_path / "dro_progress.png"
    plot_dro_progress(path, history, num_cases=4)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["dro_progress.png"]


def test_progress_png_plots_the_adaptive_statistics(tmp_path):
    """Histories of the adaptive trainer (beta, perplexity and ESS as fractions; None where a
    statistic was not available) render too."""
    history = {"epoch": [0, 1, 2], "beta": [100.0, 12.5, 9.0], "perplexity_fraction": [1.0, 0.5, 0.5],
               "ess_fraction": [1.0, 0.4, 0.38], "max_probability": [0.25, 0.3, 0.31],
               "clipped_fraction": [None, 0.1, 0.05]}
    path = tmp_path / "dro_progress.png"
    plot_dro_progress(path, history, num_cases=4)
    assert path.stat().st_size > 10_000


class FakeClock:
    """A clock the test moves by hand; ``draw_seconds`` pass during each redraw."""

    def __init__(self, draw_seconds: float):
        self.now, self.draw_seconds = 0.0, draw_seconds

    def __call__(self) -> float:
        return self.now

    def redraw(self) -> None:
        self.now += self.draw_seconds


@pytest.mark.parametrize("fraction, draw_seconds, asks_at, expected", [
    (0.01, 0.5, [0, 10, 49.9, 50, 60], [True, False, False, True, False]),  # next one at 50 s
    (0.01, 0.0, [0, 0, 0], [True, True, True]),  # a free redraw is always due
    (1.0, 0.5, [0, 0, 0], [True, True, True]),  # budget 100 %: back to back
    (0.5, 2.0, [0, 3, 4, 7.9, 8], [True, False, True, False, True]),  # 2 s drawings every 4 s
], ids=["one-percent", "free-redraw", "whole-budget", "half-budget"])
def test_redraw_pacer_keeps_drawing_within_its_fraction_of_the_wall_time(fraction, draw_seconds, asks_at, expected):
    clock = FakeClock(draw_seconds)
    pacer = RedrawPacer(fraction, clock=clock)
    drawn = []
    for t in asks_at:
        clock.now = max(clock.now, float(t))
        drawn.append(pacer.draw(clock.redraw))
    assert drawn == expected


def test_redraw_pacer_draws_when_forced():
    clock = FakeClock(10.0)
    pacer = RedrawPacer(0.01, clock=clock)
    assert pacer.draw(clock.redraw) and not pacer.draw(clock.redraw)
    assert pacer.draw(clock.redraw, force=True)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, math.nan], ids=["zero", "negative", "above-one", "nan"])
def test_redraw_pacer_refuses_a_fraction_outside_zero_one(fraction):
    with pytest.raises(ValueError, match="fraction must be in \\(0, 1\\]"):
        RedrawPacer(fraction)
