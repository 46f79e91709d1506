"""Tables, learning curves and output files of the digits experiment."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.atomic import atomic_path, write_text_atomic
from nnunet_dro.lab.experiments.digits.data import DigitsSplit
from nnunet_dro.lab.experiments.digits.methods import METHODS
from nnunet_dro.lab.experiments.digits.training import RunResult


def _std(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1)) if values.size > 1 else math.nan


def runs_table(results: Sequence[RunResult]) -> pd.DataFrame:
    """One row per run: final overall and rare-class accuracy (in %)."""
    return pd.DataFrame([{"method": r.method, "seed": r.seed, "iterations": int(r.iterations[-1]),
                          "rare_accuracy": 100 * r.final_rare_accuracy,
                          "accuracy": 100 * r.final_accuracy, "seconds": r.seconds,
                          "cpu_seconds": r.cpu_seconds,
                          "step_ms": 1e3 * r.step_seconds / max(1, r.num_steps),
                          "step_cpu_ms": 1e3 * r.step_cpu_seconds / max(1, r.num_steps),
                          "rare_weight_share": 100 * r.rare_weight_share}
                         for r in results])


def summarise(results: Sequence[RunResult], baseline: str = "erm") -> pd.DataFrame:
    """Per method: mean and std (ddof=1) over seeds of the final accuracies, in %.

    ``rare_gain_vs_erm`` is the mean over seeds of (method - ERM) on the rare class for the same
    seed (same initialisation): a paired difference. ``rare_mass`` is the sampling probability
    on the rare training images, averaged over the evaluation points and seeds;
    ``rare_weight_share`` (in %) the share of all loss weight the rare images received in the
    steps (draws x weights: the emphasis a method actually put on them, comparable between
    sampling and reweighting methods). ``step_cpu_ms`` is the mean CPU time of one training
    step (evaluation excluded) and ``step_time_vs_erm`` its ratio to ERM's in the same run.
    """
    runs = runs_table(results)
    base = runs[runs.method == baseline].set_index("seed")["rare_accuracy"]
    mass = {m: float(np.nanmean([r.rare_mass for r in results if r.method == m]))
            for m in runs.method.unique()}
    base_step = runs.loc[runs.method == baseline, "step_cpu_ms"].mean()
    rows = []
    for method, group in runs.groupby("method", sort=False):
        settings = METHODS[method].settings if method in METHODS else {}
        paired = group.set_index("seed")["rare_accuracy"] - base
        paired = paired.dropna().to_numpy()
        rows.append({
            "method": method,
            "beta": settings.get("beta", math.nan),
            "importance_sampling": settings.get("importance_sampling", ""),
            "clip": settings.get("clip", ""),
            "seeds": len(group),
            "rare_acc_mean": group.rare_accuracy.mean(), "rare_acc_std": _std(group.rare_accuracy.to_numpy()),
            "rare_acc_min": group.rare_accuracy.min(),
            "acc_mean": group.accuracy.mean(), "acc_std": _std(group.accuracy.to_numpy()),
            "rare_gain_vs_erm": float(paired.mean()) if paired.size and baseline in set(runs.method) else math.nan,
            "rare_mass": mass[method],
            "rare_weight_share": group.rare_weight_share.mean(),
            "step_ms": group.step_ms.mean(),
            "step_cpu_ms": group.step_cpu_ms.mean(),
            "step_time_vs_erm": group.step_cpu_ms.mean() / base_step if base_step > 0 else math.nan,
        })
    return pd.DataFrame(rows)


def format_markdown(summary: pd.DataFrame, rare_class: int) -> str:
    """The summary as a markdown table (accuracies in %, mean ± std over seeds)."""
    header = (f"| method | beta | IS | clip | seeds | digit {rare_class} acc | overall acc | "
              f"digit {rare_class} gain vs ERM (paired) | min digit {rare_class} acc | "
              f"sampling mass on digit {rare_class} | weight share of digit {rare_class} | "
              f"CPU ms / step | step time vs ERM |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in summary.itertuples(index=False):
        beta = f"{row.beta:g}" if isinstance(row.beta, (int, float)) else str(row.beta)
        lines.append(
            f"| {row.method} | {beta} | {'on' if row.importance_sampling else 'off'} | {row.clip} | "
            f"{row.seeds} | {row.rare_acc_mean:.1f} ± {row.rare_acc_std:.1f} | "
            f"{row.acc_mean:.1f} ± {row.acc_std:.1f} | {row.rare_gain_vs_erm:+.1f} | "
            f"{row.rare_acc_min:.1f} | {100 * row.rare_mass:.1f}% | {row.rare_weight_share:.1f}% | "
            f"{row.step_cpu_ms:.2f} | {row.step_time_vs_erm:.2f}x |")
    return "\n".join(lines) + "\n"


def format_legend(methods: Iterable[str]) -> str:
    """One line per method: its description from the registry."""
    return "\n".join(f"- {name}: {METHODS[name].description}" for name in methods if name in METHODS) + "\n"


def curves_table(results: Sequence[RunResult]) -> pd.DataFrame:
    """Long format: one row per (method, seed, iteration)."""
    frames = [pd.DataFrame({"method": r.method, "seed": r.seed, "iteration": r.iterations,
                            "accuracy": 100 * r.accuracy, "rare_accuracy": 100 * r.rare_accuracy,
                            "train_loss": r.train_loss, "rare_mass": r.rare_mass}) for r in results]
    return pd.concat(frames, ignore_index=True)


def plot_learning_curves(results: Sequence[RunResult], path: str | Path, rare_class: int,
                         title: str = "") -> None:
    """PNG: test accuracy on the rare digit, overall test accuracy and training loss vs
    iteration, mean over seeds (shaded: min-max over seeds for the accuracies)."""
    seeds = sorted({r.seed for r in results})
    subtitle = f"curves: mean over {len(seeds)} seed(s); shaded: min-max over seeds"
    title = f"{title}\n{subtitle}" if title else subtitle
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = curves_table(results)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    panels = [("rare_accuracy", f"test accuracy on digit {rare_class} (%)"),
              ("accuracy", "overall test accuracy (%)"),
              ("train_loss", "training loss (mean CE over the training split)")]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (method, group) in enumerate(curves.groupby("method", sort=False)):
        stats = group.groupby("iteration")
        colour = colours[k % len(colours)]
        # solid: ERM and KL-DRO with importance sampling; dashed: other sampling; dash-dot: reweighting
        style = ("-" if method == "erm" or method.startswith("dro-is") else
                 "--" if method.startswith("dro") else "-.")
        for ax, (column, _) in zip(axes, panels):
            mean = stats[column].mean()
            ax.plot(mean.index, mean.to_numpy(), style, color=colour, label=method,
                    linewidth=2.2 if method == "erm" else 1.4)
            if column != "train_loss":
                ax.fill_between(mean.index, stats[column].min().to_numpy(), stats[column].max().to_numpy(),
                                color=colour, alpha=0.08)
    for ax, (column, label) in zip(axes, panels):
        ax.set_xlabel("iteration")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write_outputs(results: Sequence[RunResult], summary: pd.DataFrame, output: str | Path,
                  split: DigitsSplit, header: str) -> dict[str, Path]:
    """Write summary.csv, summary.md, runs.csv, curves.csv and learning_curves.png (atomically)."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    paths = {name: output / name for name in
             ("summary.csv", "summary.md", "runs.csv", "curves.csv", "learning_curves.png")}
    write_text_atomic(paths["summary.csv"], summary.to_csv(index=False, float_format="%.4f"))
    write_text_atomic(paths["summary.md"], f"{header}\n\n{format_markdown(summary, split.rare_class)}\n"
                                           f"{format_legend(summary.method)}")
    write_text_atomic(paths["runs.csv"], runs_table(results).to_csv(index=False, float_format="%.4f"))
    write_text_atomic(paths["curves.csv"], curves_table(results).to_csv(index=False, float_format="%.5g"))
    plot_learning_curves(results, paths["learning_curves.png"], split.rare_class,
                         title="; ".join(header.split("; ")[:2]))  # the setting, without "mean ± std"
    return paths
