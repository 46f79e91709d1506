"""The hardness report written beside nnU-Net's ``progress.png`` in the fold folder.

- ``dro_hardness.csv``: one row per training case of the fold, hardest first, with the columns
  ``case, stale_loss, probability, times_drawn`` (final stale loss, sampling probability
  ``softmax(beta * L)``, number of fresh losses the case contributed). Cases a model finds hard
  are often label errors or rare anatomy: look at the top rows.
  Schemes with groups (group-balanced sampling, group DRO, case weights with groups) add a
  ``group`` column; the error-set scheme adds ``in_error_set, error_set_epoch, draws_since_fixed, draw_share``.
- ``dro_groups.csv`` (schemes with groups): one row per group: ``group, cases, probability,
  times_drawn`` and, for group DRO, ``q`` (the current group weight).
- ``dro_progress.png``: the per-epoch sampler statistics: beta in force, perplexity ``exp(H(p))``
  and effective sample size ``1/sum(p^2)`` as fractions of ``n``, max p, fraction of clipped
  importance weights; with groups, the share of draws per group (and group DRO's ``q``).

Both files are written atomically, so a crash mid-write never leaves a truncated report. The csv
costs milliseconds and is rewritten every epoch; drawing the png costs 0.3-0.8 s on a CPU, which
:class:`RedrawPacer` keeps to a fixed fraction of the training's wall time.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.atomic import atomic_path
from nnunet_dro.weighting.hardness import UNIFORM_BETA

HARDNESS_CSV = "dro_hardness.csv"
GROUPS_CSV = "dro_groups.csv"
PROGRESS_PNG = "dro_progress.png"
CSV_COLUMNS = ("case", "stale_loss", "probability", "times_drawn")
#: columns only some schemes have: the group, and JTT's error set inside one training (whether a case
#: is in the set in force, the epoch that set was chosen at, the case's draws since then and their
#: share of all such draws)
OPTIONAL_COLUMNS = ("group", "in_error_set", "error_set_epoch", "draws_since_fixed", "draw_share")


class RedrawPacer:
    """Paces a costly redraw so that it takes at most ``fraction`` of the wall time.

    The first call draws; after a redraw that took ``c`` seconds, the next one is due once
    ``c / fraction`` seconds have passed since that redraw started; ``force=True`` draws anyway
    (the end of training). With a 0.5 s plot and a 1 % budget, a GPU epoch of 40 s redraws about
    every second epoch, a CPU epoch of 13 s every fourth: the figure lags by a few epochs, the
    training does not pay for it.

    >>> ticks = iter([0.0, 0.5, 10.0, 50.0, 50.4, 60.0, 60.5]).__next__
    >>> pacer = RedrawPacer(0.01, clock=ticks)
    >>> [pacer.draw(lambda: None) for _ in range(3)], pacer.draw(lambda: None, force=True)
    ([True, False, True], True)
    """

    def __init__(self, fraction: float = 0.01, clock: Callable[[], float] = time.perf_counter):
        if not 0.0 < float(fraction) <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        self.fraction = float(fraction)
        self._clock = clock
        self._last_start: float | None = None
        self._last_cost = 0.0

    def due(self, now: float) -> bool:
        """True if a redraw at time ``now`` keeps the drawing time within the budget."""
        return self._last_start is None or now - self._last_start >= self._last_cost / self.fraction

    def draw(self, redraw: Callable[[], None], force: bool = False) -> bool:
        """Call ``redraw()`` if it is due (or ``force``); return whether it was called."""
        start = self._clock()
        if not (force or self.due(start)):
            return False
        redraw()
        self._last_start, self._last_cost = start, max(0.0, self._clock() - start)
        return True


def hardness_table(case_ids: Sequence[str], stale_losses: Sequence[float], probabilities: Sequence[float],
                   times_drawn: Sequence[int], groups: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per case, hardest (highest stale loss) first; ties keep the case order. With
    ``groups``, a ``group`` column.

    >>> hardness_table(["a", "b"], [0.1, 0.5], [0.2, 0.8], [3, 1])["case"].tolist()
    ['b', 'a']
    """
    n = len(case_ids)
    if not (len(stale_losses) == len(probabilities) == len(times_drawn) == n):
        raise ValueError("case_ids, stale_losses, probabilities and times_drawn must have the same length")
    table = pd.DataFrame({
        "case": [str(c) for c in case_ids],
        "stale_loss": np.asarray(stale_losses, dtype=np.float64),
        "probability": np.asarray(probabilities, dtype=np.float64),
        "times_drawn": np.asarray(times_drawn, dtype=np.int64),
    })
    if groups is not None:
        if len(groups) != n:
            raise ValueError("groups must have one label per case")
        table["group"] = [str(g) for g in groups]
    return table.sort_values("stale_loss", ascending=False, kind="stable").reset_index(drop=True)


def write_hardness_csv(path: str | os.PathLike, table: pd.DataFrame) -> None:
    """Write the table of :func:`hardness_table` atomically (full float precision)."""
    columns = list(CSV_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in table.columns]
    with atomic_path(path) as tmp:
        table.loc[:, columns].to_csv(tmp, index=False, float_format="%.10g")


def group_table(case_table: pd.DataFrame, group_weights: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Per group: number of cases, total draw probability, draws (and ``q`` if given).

    >>> cases = hardness_table(["a", "b", "c"], [0.1, 0.5, 0.3], [0.25, 0.25, 0.5], [2, 1, 4], ["x", "x", "y"])
    >>> table = group_table(cases)
    >>> table["group"].tolist(), table["cases"].tolist(), table["times_drawn"].tolist()
    (['x', 'y'], [2, 1], [3, 4])
    """
    grouped = case_table.groupby("group", sort=True)
    table = pd.DataFrame({"group": list(grouped.groups), "cases": grouped.size().to_numpy(),
                          "probability": grouped["probability"].sum().to_numpy(),
                          "times_drawn": grouped["times_drawn"].sum().to_numpy()})
    if group_weights is not None:
        table["q"] = [float(group_weights.get(g, np.nan)) for g in table["group"]]
    return table


def write_group_csv(path: str | os.PathLike, table: pd.DataFrame) -> None:
    """Write the table of :func:`group_table` atomically."""
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.10g")


def plot_dro_progress(path: str | os.PathLike, history: Mapping[str, Sequence], num_cases: int) -> None:
    """Plot the per-epoch sampler statistics of ``history`` to a png, atomically.

    ``history`` holds equal-length lists under ``epoch`` and any of ``beta``,
    ``perplexity_fraction``, ``ess_fraction``, ``effective_sample_size``, ``max_probability`` and
    ``clipped_fraction`` (NaN when importance sampling is off); missing series are left empty
    (histories of earlier releases have no beta or perplexity). Epochs with a true ``backed_off``
    (the stability guard sampled uniformly) are shaded in every panel, and so, in grey, the other
    epochs drawn at the uniform beta (an adaptive scheme's ERM phase): a run that never left that
    phase must not read as a robust one.
    """
    import matplotlib
    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = list(history.get("epoch", []))

    def series(key: str) -> np.ndarray | None:
        values = history.get(key)
        if values is None or len(values) != len(epochs) or not epochs:
            return None
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

    ess = series("ess_fraction")
    if ess is None and series("effective_sample_size") is not None and num_cases > 0:
        ess = series("effective_sample_size") / num_cases
    def per_group(key: str, as_share: bool) -> list:
        values = history.get(key)
        if values is None or len(values) != len(epochs) or not any(v for v in values):
            return []
        names = sorted({g for v in values if v for g in v})
        rows = [v or {} for v in values]
        totals = [sum(r.values()) or np.nan for r in rows] if as_share else [1.0] * len(rows)
        return [(g, np.array([r.get(g, np.nan) / t for r, t in zip(rows, totals)], dtype=np.float64))
                for g in names]

    panels = [
        ("beta in force", [("beta", series("beta"))], None),
        ("spread of p over the cases (fraction of n)",
         [("perplexity exp(H(p)) / n", series("perplexity_fraction")), ("effective sample size / n", ess)], 1.0),
        ("max p", [("max p", series("max_probability"))], 1.0 / num_cases if num_cases > 0 else None),
        ("fraction of clipped importance weights", [("clipped", series("clipped_fraction"))], None),
    ]
    group_draws = per_group("group_draws", as_share=True)
    if group_draws:
        panels.append(("share of the epoch's draws per group", group_draws, None))
    group_weights = per_group("group_weights", as_share=False)
    if group_weights:
        panels.append(("group DRO weight q per group", group_weights, None))
    backoff_spans = _true_spans(epochs, history.get("backed_off"))
    erm_spans = _true_spans(epochs, erm_phase_flags(history))
    # nnU-Net's logger switches seaborn's large-font style on globally: draw in matplotlib's default
    with plt.style.context("default"):
        fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3 * len(panels)), sharex=True)
        for ax, (title, lines, reference) in zip(axes, panels):
            drawn = False
            for label, values in lines:
                if values is not None and np.isfinite(values).any():
                    ax.plot(epochs, values, marker="o" if len(epochs) < 30 else None, linewidth=2, label=label)
                    drawn = True
            if not drawn:
                ax.text(0.5, 0.5, "importance sampling off" if "clipped" in title else "not recorded",
                        transform=ax.transAxes, ha="center")
            if reference is not None:
                ax.axhline(reference, color="grey", ls="--", label="uniform sampling")
            for i, (start, stop) in enumerate(backoff_spans):
                ax.axvspan(start, stop, color="tab:red", alpha=0.15,
                           label="stability guard: uniform sampling" if i == 0 else None)
            for i, (start, stop) in enumerate(erm_spans):
                ax.axvspan(start, stop, color="grey", alpha=0.15,
                           label="ERM phase: uniform sampling" if i == 0 else None)
            if drawn or reference is not None or backoff_spans or erm_spans:
                ax.legend(loc="best", fontsize=9)
            ax.set_title(title, fontsize=11)
            ax.grid(alpha=0.3)
        axes[-1].set_xlabel("epoch")
        axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(f"Case weighting over {num_cases} training cases")
        fig.tight_layout()
        try:
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format="png")
        finally:
            plt.close(fig)


def erm_phase_flags(history: Mapping[str, Sequence]) -> list | None:
    """Per epoch: drawn at the uniform beta without a guard back-off (an adaptive scheme's ERM
    phase); None when the history has no beta of the same length as its epochs.

    >>> erm_phase_flags({"epoch": [0, 1, 2], "beta": [1e-12, 1e-12, 40.0], "backed_off": [False, True, False]})
    [True, False, False]
    """
    epochs, beta = history.get("epoch", []), history.get("beta")
    if beta is None or len(beta) != len(epochs):
        return None
    backed = history.get("backed_off")
    backed = backed if backed is not None and len(backed) == len(epochs) else [False] * len(epochs)
    return [bool(b is not None and np.isfinite(b) and b <= UNIFORM_BETA * (1 + 1e-9) and not off)
            for b, off in zip(beta, backed)]


def _true_spans(epochs: Sequence, flags: Sequence | None) -> list[tuple[float, float]]:
    """``(start, stop)`` x-ranges covering the runs of epochs whose flag is true (each epoch drawn
    as ``[e - 0.5, e + 0.5]``); none when the flags are missing or of another length.

    >>> _true_spans([0, 1, 2, 3, 4], [False, True, True, None, True])
    [(0.5, 2.5), (3.5, 4.5)]
    """
    if flags is None or len(flags) != len(epochs):
        return []
    spans: list[tuple[float, float]] = []
    for epoch, flag in zip(epochs, flags):
        if not flag:
            continue
        if spans and spans[-1][1] == epoch - 0.5:
            spans[-1] = (spans[-1][0], epoch + 0.5)
        else:
            spans.append((epoch - 0.5, epoch + 0.5))
    return spans
