"""What a finished arm's run tells: its training (epochs, stability, the sampler's statistics,
read from the final checkpoint) and whether it learned the majority (the regime check of a run)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.lab.cohort_folder import GROUP_COLUMN, MAJORITY_GROUP
from nnunet_dro.training.stability import (
    ALL_LEARNED,
    LEARNED,
    START_EPOCH,
    THRESHOLD,
    all_learned_epoch,
    collapsed_epochs,
    learning_time_text,
    lost_epochs,
)
from nnunet_dro.weighting.hardness import UNIFORM_BETA

#: "ERM has learned the majority": every region's mean Dice of the controls at least this.
CONVERGED_DICE = 80.0


def training_summary(fold_dir: Path) -> dict:
    """What a finished training's checkpoint tells about it: epochs, stability, final pseudo-Dice,
    and for DRO arms the sampler's last and average statistics."""
    import torch

    checkpoint = torch.load(str(fold_dir / "checkpoint_final.pth"), map_location="cpu", weights_only=False)
    logging = checkpoint.get("logging", {})
    dice = [list(map(float, d)) for d in logging.get("dice_per_class_or_region", [])]
    out = {"epochs": len(dice), "collapsed_epochs": collapsed_epochs(dice), "lost_epochs": lost_epochs(dice),
           "all_learned_epoch": all_learned_epoch(dice),
           "collapse_rule": f"epochs >= {START_EPOCH} with a pseudo-Dice < {THRESHOLD}",
           "lost_rule": f"epochs with a pseudo-Dice < {THRESHOLD} of a structure that had reached {LEARNED}",
           "all_learned_rule": f"first epoch with every structure's pseudo-Dice >= {ALL_LEARNED}",
           "final_pseudo_dice": dice[-1] if dice else [],
           "final_train_loss": float(logging.get("train_losses", [np.nan])[-1])}
    history = (checkpoint.get("dro_state") or {}).get("history") or {}
    for key in ("beta", "perplexity_fraction", "ess_fraction", "clipped_fraction", "max_probability"):
        values = np.asarray([v for v in history.get(key, []) if v is not None], dtype=np.float64)
        if values.size:
            out[f"dro_{key}_last"] = float(values[-1])
            out[f"dro_{key}_mean"] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    backed_off = [bool(v) for v in history.get("backed_off", []) if v is not None]
    if backed_off:  # the stability guard of the adaptive trainers
        out["guard_backoffs"] = int(sum(b and not a for a, b in zip([False] + backed_off, backed_off)))
        out["guard_uniform_epochs"] = int(sum(backed_off))
    if history.get("beta"):
        out["dro_robust_from_epoch"] = robust_from_epoch(history["beta"], history.get("epoch"))
    return out


def robust_from_epoch(betas: Sequence, epochs: Sequence | None = None) -> int | None:
    """The first epoch that drew under a beta well above the uniform phase's (``UNIFORM_BETA``),
    i.e. with robust weighting on; None if the run stayed uniform (ERM) throughout.

    >>> robust_from_epoch([1e-12, 1e-12, 3.5, 2.0]), robust_from_epoch([1e-12, None]), robust_from_epoch([4.0])
    (2, None, 0)
    """
    epochs = list(range(len(betas))) if epochs is None else list(epochs)
    for epoch, beta in zip(epochs, betas):
        if beta is not None and np.isfinite(beta) and beta > 1e3 * UNIFORM_BETA:
            return int(epoch)
    return None


def majority_means(per_case: pd.DataFrame) -> dict[str, float]:
    """Mean Dice (%) of the controls per region."""
    controls = per_case[per_case[GROUP_COLUMN] == MAJORITY_GROUP]
    return {str(r): float(v) for r, v in controls.groupby("region", sort=False)["value"].mean().items()}


def majority_learned(means: Mapping[str, float]) -> bool:
    """Whether every control region's mean Dice (%) is at least ``CONVERGED_DICE``: the regime check
    of a run, and what makes a seed count in the decision regime (scripts/evidence_intervals.py).

    >>> majority_learned({"white_matter": 93.0, "intra_axial_csf": 71.3}), majority_learned({})
    (False, False)
    """
    return bool(means) and min(means.values()) >= CONVERGED_DICE


def convergence_line(arm: str, summary: Mapping) -> str:
    """How converged a run is, in one line (the benchmark's and the demo's regime check)."""
    means = summary.get("control_mean_dice", {})
    ok = majority_learned(means)
    text = ", ".join(f"{r} {v:.1f}" for r, v in means.items())
    return (f"  {arm}: controls' mean Dice {text} ({'all' if ok else 'NOT all'} >= {CONVERGED_DICE:g}); "
            f"{summary.get('collapsed_epochs', '?')} of {max(0, summary.get('epochs', 0) - START_EPOCH)} epochs "
            f"since epoch {START_EPOCH} with a structure's pseudo-Dice < {THRESHOLD:g}, "
            f"{summary.get('lost_epochs', '?')} with a learned structure lost; "
            + (f"{learning_time_text(summary['all_learned_epoch'], summary.get('epochs', 0))}; "
               if "all_learned_epoch" in summary else "")
            + (f"stability guard: {summary['guard_backoffs']} back-off(s), {summary['guard_uniform_epochs']} "
               f"epochs sampled uniformly; " if summary.get("guard_backoffs") is not None else "")
            + f"trained in {summary.get('train_seconds', float('nan')):.0f} s")
