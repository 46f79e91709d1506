"""The hardness report written beside nnU-Net's ``progress.png`` in the fold folder.

- ``dro_hardness.csv``: one row per training case of the fold, hardest first, with the columns
  ``case, stale_loss, probability, times_drawn`` (final stale loss, sampling probability
  ``softmax(beta * L)``, number of fresh losses the case contributed). Cases a model finds hard
  are often label errors or rare anatomy: look at the top rows.
- ``dro_progress.png``: the per-epoch sampler statistics (entropy of p against its maximum
  ``log n``, effective sample size against ``n``, max p, fraction of clipped importance weights).

Both files are written atomically, so a crash mid-write never leaves a truncated report.
"""
from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.atomic import atomic_path

HARDNESS_CSV = "dro_hardness.csv"
PROGRESS_PNG = "dro_progress.png"
CSV_COLUMNS = ("case", "stale_loss", "probability", "times_drawn")


def hardness_table(case_ids: Sequence[str], stale_losses: Sequence[float], probabilities: Sequence[float],
                   times_drawn: Sequence[int]) -> pd.DataFrame:
    """One row per case, hardest (highest stale loss) first; ties keep the case order.

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
    return table.sort_values("stale_loss", ascending=False, kind="stable").reset_index(drop=True)


def write_hardness_csv(path: str | os.PathLike, table: pd.DataFrame) -> None:
    """Write the table of :func:`hardness_table` atomically (full float precision)."""
    with atomic_path(path) as tmp:
        table.loc[:, list(CSV_COLUMNS)].to_csv(tmp, index=False, float_format="%.10g")


def plot_dro_progress(path: str | os.PathLike, history: Mapping[str, Sequence], num_cases: int) -> None:
    """Plot the per-epoch sampler statistics of ``history`` to a png, atomically.

    ``history`` holds equal-length lists under ``epoch``, ``entropy``, ``effective_sample_size``,
    ``max_probability`` and ``clipped_fraction`` (NaN when importance sampling is off).
    """
    import matplotlib
    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = list(history.get("epoch", []))
    panels = [
        ("entropy", "entropy of p (nats)", math.log(num_cases) if num_cases > 0 else None, "uniform: log n"),
        ("effective_sample_size", "effective sample size 1/sum(p^2)", num_cases, "uniform: n"),
        ("max_probability", "max p", 1.0 / num_cases if num_cases > 0 else None, "uniform: 1/n"),
        ("clipped_fraction", "fraction of clipped importance weights", None, None),
    ]
    # nnU-Net's logger switches seaborn's large-font style on globally: draw in matplotlib's default
    with plt.style.context("default"):
        fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
        for ax, (key, title, reference, reference_label) in zip(axes, panels):
            values = np.asarray(history.get(key, []), dtype=np.float64)
            if len(values) == len(epochs) and len(epochs) > 0:
                ax.plot(epochs, values, color="tab:blue", marker="o" if len(epochs) < 30 else None, linewidth=2)
                if key == "clipped_fraction" and np.isnan(values).all():
                    ax.text(0.5, 0.5, "importance sampling off", transform=ax.transAxes, ha="center")
            if reference is not None:
                ax.axhline(reference, color="grey", ls="--", label=reference_label)
                ax.legend(loc="best")
            ax.set_title(title, fontsize=11)
            ax.grid(alpha=0.3)
        axes[-1].set_xlabel("epoch")
        axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(f"Hardness weighted sampling over {num_cases} training cases")
        fig.tight_layout()
        try:
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format="png")
        finally:
            plt.close(fig)
