"""Class-imbalance toy of the paper (section 4.1) on scikit-learn's bundled handwritten digits.

The paper trains on MNIST with only 1% of the digit 3 kept and compares plain SGD (ERM, uniform
sampling) with SGD + hardness weighted sampling (KL-DRO, Algorithm 1) on the untouched test set.
Here the data are the 1797 real 8x8 digits that ship with scikit-learn (``load_digits``: no
download), so the whole comparison runs on one CPU core in minutes:

1. :func:`load_imbalanced_digits`: stratified train/test split with a fixed seed, then all but a
   handful of the rare digit are removed from the training split only.
2. :class:`SmallCNN`: two 3x3 convolutions and a linear layer, trained by :func:`train_run` with
   plain SGD (no momentum, no weight decay, no augmentation) on per-example cross-entropy
   ``l_i`` weighted as in Algorithm 1: the step is on ``mean_i(w_i * l_i)``.
3. Methods are rows of a registry, :data:`METHODS` (name -> :class:`MethodSpec`). A method
   decides which examples form a batch and how their losses are weighted
   (:class:`TrainingMethod`); ERM and the hardness weighted sampler are the first rows, and the
   related methods of method.md section 6 (chi-square sampling, KL reweighting, ...) can be
   added as more rows without touching the training loop.
4. :func:`run_experiment`, :func:`summarise`, :func:`plot_learning_curves` and
   :func:`write_outputs` produce the table (mean and std over seeds) and learning curves.

Example (a few seconds):

>>> split = load_imbalanced_digits(rare_fraction=0.035)
>>> split.rare_kept, split.rare_available
(5, 146)
>>> runs = run_experiment(split, ["erm", "dro-is-beta10"], seeds=[0], iterations=20,
...                       eval_every=10)
>>> sorted(summarise(runs)["method"])
['dro-is-beta10', 'erm']
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import nn

from nnunet_dro.atomic import atomic_path, write_text_atomic
from nnunet_dro.errors import UserError
from nnunet_dro.sampling import HardnessWeightedSampler

NUM_CLASSES = 10
# Paper, section 4.1: lr 0.01, no momentum, no weight decay, no augmentation. It does not state
# the batch size; 32 is our choice.
DEFAULT_LR = 0.01
DEFAULT_BATCH_SIZE = 32
DEFAULT_RARE_CLASS = 3
# 0.035 of the 146 training threes of the default split = 5 images (the paper kept 1% of MNIST's
# ~6000 threes, i.e. ~60; 1% of 146 would leave a single image).
DEFAULT_RARE_FRACTION = 0.035
DEFAULT_TEST_SIZE = 0.2
DEFAULT_BETAS = (0.1, 1.0, 10.0, 100.0)
DEFAULT_CLIP = (0.1, 10.0)


# ---------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class DigitsSplit:
    """Imbalanced training split and full test split; images are float32 in [0, 1], (N, 8, 8)."""

    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]
    rare_class: int
    rare_fraction: float
    rare_kept: int        # images of the rare class left in the training split
    rare_available: int   # images of the rare class the stratified training split had

    @property
    def num_train(self) -> int:
        return int(self.y_train.size)

    def describe(self) -> str:
        counts = np.bincount(self.y_train, minlength=NUM_CLASSES)
        return (f"training: {self.num_train} images, digit {self.rare_class}: kept {self.rare_kept} "
                f"of {self.rare_available} (fraction {self.rare_fraction:g}); other digits "
                f"{counts[np.arange(NUM_CLASSES) != self.rare_class].min()}-"
                f"{counts[np.arange(NUM_CLASSES) != self.rare_class].max()} each; test: "
                f"{self.y_test.size} images, digit {self.rare_class}: "
                f"{int((self.y_test == self.rare_class).sum())}")


def rare_count(available: int, fraction: float) -> int:
    """Images of the rare class to keep: ``round(fraction * available)``, at least 1.

    >>> rare_count(146, 0.035), rare_count(146, 0.01), rare_count(146, 1.0)
    (5, 1, 146)
    """
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise UserError(f"rare fraction must lie in (0, 1], got {fraction!r}")
    return max(1, min(available, int(round(fraction * available))))


def load_imbalanced_digits(rare_class: int = DEFAULT_RARE_CLASS,
                           rare_fraction: float = DEFAULT_RARE_FRACTION,
                           test_size: float = DEFAULT_TEST_SIZE, data_seed: int = 0) -> DigitsSplit:
    """scikit-learn's ``load_digits``, stratified split, rare class thinned in training only.

    The split and the choice of the kept rare images depend on ``data_seed`` only, so every
    method and every training seed sees the same data.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if rare_class not in range(NUM_CLASSES):
        raise UserError(f"rare class must be a digit 0-9, got {rare_class!r}")
    if not 0.0 < test_size < 1.0:
        raise UserError(f"test size must lie in (0, 1), got {test_size!r}")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # pixel values are 0..16
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_size, stratify=labels, random_state=data_seed)
    rare_idx = np.flatnonzero(y_train == rare_class)
    keep = rare_count(rare_idx.size, rare_fraction)
    kept = np.random.default_rng(data_seed).choice(rare_idx, size=keep, replace=False)
    mask = y_train != rare_class
    mask[kept] = True
    return DigitsSplit(x_train[mask], y_train[mask], x_test, y_test, rare_class, float(rare_fraction),
                       keep, int(rare_idx.size))


# ---------------------------------------------------------------------------------- model
class SmallCNN(nn.Module):
    """conv3x3(1->8)-ReLU, conv3x3(8->16)-ReLU, 2x2 max-pool, linear(256->10). ~3k parameters.

    Small on purpose: the per-iteration cost on one CPU core is dominated by framework overhead,
    and the paper's WRN-16-1 would make 25 runs take far longer than the few minutes allowed.
    """

    def __init__(self, channels: tuple[int, int] = (8, 16)):
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(c2 * 4 * 4, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, 1, 8, 8) -> (N, 10) logits
        return self.classifier(self.features(x))


# ---------------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class MethodContext:
    """What a method may know when it is built: the training set size and labels and the seed.

    Labels are given for methods that need a clean validation subset (learning to reweight);
    DRO methods must not use them (the paper's point is that the rare group is unknown).
    """

    num_train: int
    labels: NDArray[np.int64]
    seed: int


class TrainingMethod(Protocol):
    """One row of the comparison: chooses the batch and weighs its per-example losses.

    Per iteration the loop calls ``sample(b)``, computes the fresh per-example losses ``l`` of
    those examples, then ``weigh(indices, l)`` (which may update the method's state) and steps
    on ``mean(w * l)``.
    """

    def sample(self, batch_size: int) -> NDArray[np.int64]: ...

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]: ...

    def sampling_probabilities(self) -> NDArray[np.float64] | None:
        """Current distribution over training examples, if the method has one (diagnostics)."""
        ...

    def close(self) -> None: ...


class UniformSampling:
    """ERM with SGD: i.i.d. uniform draws with replacement, every weight 1."""

    def __init__(self, context: MethodContext):
        self._n = context.num_train
        self._rng = np.random.default_rng(context.seed)

    def sample(self, batch_size: int) -> NDArray[np.int64]:
        return self._rng.integers(0, self._n, size=batch_size, dtype=np.int64)

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.ones(len(indices), dtype=np.float64)

    def sampling_probabilities(self) -> NDArray[np.float64]:
        return np.full(self._n, 1.0 / self._n)

    def close(self) -> None:
        pass


class HardnessWeightedSampling:
    """KL-DRO with Algorithm 1: draws from ``softmax(beta * L)`` of the stale losses ``L``.

    ``L`` starts at ``log(10)`` for every example (the cross-entropy of a classifier that knows
    nothing, plus the sampler's tiny tie-breaking noise), so examples not seen yet look hard and
    are visited early.
    """

    def __init__(self, context: MethodContext, beta: float, importance_sampling: bool,
                 clip: tuple[float, float] = DEFAULT_CLIP):
        self.sampler = HardnessWeightedSampler(context.num_train, beta=beta,
                                               init_loss=math.log(NUM_CLASSES),
                                               importance_sampling=importance_sampling,
                                               clip=clip, seed=context.seed)

    def sample(self, batch_size: int) -> NDArray[np.int64]:
        return self.sampler.sample(batch_size)

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]:
        weights = self.sampler.importance_weights(indices, losses)  # against the stale losses
        self.sampler.update(indices, losses)
        return weights

    def sampling_probabilities(self) -> NDArray[np.float64]:
        return self.sampler.probabilities()

    def close(self) -> None:
        self.sampler.close()


@dataclass(frozen=True)
class MethodSpec:
    """A registry row: how to build the method, and its settings shown in the results table."""

    name: str
    build: Callable[[MethodContext], TrainingMethod]
    settings: dict[str, Any] = field(default_factory=dict)


def _dro_spec(beta: float, importance_sampling: bool) -> MethodSpec:
    prefix = "dro-is" if importance_sampling else "dro"
    return MethodSpec(
        name=f"{prefix}-beta{beta:g}",
        build=lambda ctx: HardnessWeightedSampling(ctx, beta, importance_sampling),
        settings={"beta": beta, "importance_sampling": importance_sampling,
                  "clip": f"[{DEFAULT_CLIP[0]:g}, {DEFAULT_CLIP[1]:g}]" if importance_sampling else "-"})


def _build_registry() -> dict[str, MethodSpec]:
    specs = [MethodSpec("erm", UniformSampling, {"beta": 0.0, "importance_sampling": False, "clip": "-"})]
    for importance_sampling in (True, False):
        specs += [_dro_spec(beta, importance_sampling) for beta in DEFAULT_BETAS]
    return {spec.name: spec for spec in specs}


#: name -> method. Add related methods (chi-square sampling, KL reweighting, learning to
#: reweight) here; the loop, table and plots pick them up by name.
METHODS: dict[str, MethodSpec] = _build_registry()
#: ERM and DRO with importance sampling (clip [0.1, 10]) for beta in {0.1, 1, 10, 100}, plus the
#: paper's exact toy setting for beta = 10 (section 4.1 used DRO *without* importance sampling).
DEFAULT_METHODS: tuple[str, ...] = ("erm", *(f"dro-is-beta{b:g}" for b in DEFAULT_BETAS), "dro-beta10")


def check_method_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise UserError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    if not names:
        raise UserError("no method given")
    return names


# ---------------------------------------------------------------------------------- training
@dataclass
class RunResult:
    """One training run. Curves are sampled at ``iterations`` (0 = before the first step)."""

    method: str
    seed: int
    iterations: NDArray[np.int64]
    accuracy: NDArray[np.float64]        # overall test accuracy
    rare_accuracy: NDArray[np.float64]   # test accuracy on the rare class (its recall)
    train_loss: NDArray[np.float64]      # mean cross-entropy over the whole training split
    rare_mass: NDArray[np.float64]       # sampling probability on the rare training images
    seconds: float                       # wall clock
    cpu_seconds: float                   # CPU time of this process (wall time lies on a busy machine)

    @property
    def final_accuracy(self) -> float:
        return float(self.accuracy[-1])

    @property
    def final_rare_accuracy(self) -> float:
        return float(self.rare_accuracy[-1])


def _accuracies(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rare: torch.Tensor) -> tuple[float, float]:
    """Overall accuracy and accuracy on the rare class (no dropout/batch norm: mode is moot)."""
    with torch.no_grad():
        correct = model(x).argmax(dim=1) == y
    return float(correct.float().mean()), float(correct[rare].float().mean())


def _mean_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def train_run(split: DigitsSplit, method: str, seed: int, iterations: int,
              batch_size: int = DEFAULT_BATCH_SIZE, lr: float = DEFAULT_LR,
              eval_every: int = 100) -> RunResult:
    """Train a fresh :class:`SmallCNN` with ``method`` for ``iterations`` SGD steps.

    The seed fixes the network initialisation (identical across methods, so differences
    between methods are paired) and the method's draws.
    """
    if iterations < 1 or batch_size < 1 or eval_every < 1:
        raise UserError(f"iterations, batch size and eval interval must be >= 1, got "
                        f"{iterations}, {batch_size}, {eval_every}")
    if not (math.isfinite(lr) and lr > 0):
        raise UserError(f"learning rate must be a positive number, got {lr!r}")
    spec = METHODS[check_method_names([method])[0]]
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    model = SmallCNN()
    optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0, weight_decay=0.0)
    x_train = torch.from_numpy(split.x_train).unsqueeze(1)
    y_train = torch.from_numpy(split.y_train)
    x_test = torch.from_numpy(split.x_test).unsqueeze(1)
    y_test = torch.from_numpy(split.y_test)
    rare_test = y_test == split.rare_class
    rare_train = split.y_train == split.rare_class

    curve: dict[str, list[float]] = {k: [] for k in ("it", "acc", "rare", "loss", "mass")}

    def record(iteration: int, probabilities) -> None:
        acc, rare_acc = _accuracies(model, x_test, y_test, rare_test)
        curve["it"].append(iteration)
        curve["acc"].append(acc)
        curve["rare"].append(rare_acc)
        curve["loss"].append(_mean_loss(model, x_train, y_train))
        curve["mass"].append(float(probabilities[rare_train].sum()) if probabilities is not None else math.nan)

    training = spec.build(MethodContext(split.num_train, split.y_train, seed))
    try:
        record(0, training.sampling_probabilities())
        for iteration in range(1, iterations + 1):
            indices = training.sample(batch_size)
            batch = torch.from_numpy(indices)
            losses = F.cross_entropy(model(x_train[batch]), y_train[batch], reduction="none")
            fresh = losses.detach().double().numpy()
            weights = torch.from_numpy(training.weigh(indices, fresh)).to(losses.dtype)
            optimiser.zero_grad(set_to_none=True)
            (weights * losses).mean().backward()  # (1/b) sum_i w_i grad l_i, Algorithm 1 line 12
            optimiser.step()
            if iteration % eval_every == 0 or iteration == iterations:
                record(iteration, training.sampling_probabilities())
    finally:
        training.close()
    return RunResult(method, seed, np.asarray(curve["it"], dtype=np.int64), np.asarray(curve["acc"]),
                     np.asarray(curve["rare"]), np.asarray(curve["loss"]), np.asarray(curve["mass"]),
                     time.perf_counter() - start, time.process_time() - cpu_start)


def run_experiment(split: DigitsSplit, methods: Sequence[str], seeds: Sequence[int], iterations: int,
                   batch_size: int = DEFAULT_BATCH_SIZE, lr: float = DEFAULT_LR, eval_every: int = 100,
                   progress: Callable[[int, int, RunResult], None] | None = None) -> list[RunResult]:
    """Every method x every seed, sequentially (one CPU thread each)."""
    methods = check_method_names(methods)
    if not seeds:
        raise UserError("no seed given")
    total = len(methods) * len(seeds)
    results = []
    for seed in seeds:
        for method in methods:
            result = train_run(split, method, int(seed), iterations, batch_size, lr, eval_every)
            results.append(result)
            if progress is not None:
                progress(len(results), total, result)
    return results


# ---------------------------------------------------------------------------------- reporting
def _std(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1)) if values.size > 1 else math.nan


def runs_table(results: Sequence[RunResult]) -> pd.DataFrame:
    """One row per run: final overall and rare-class accuracy (in %)."""
    return pd.DataFrame([{"method": r.method, "seed": r.seed, "iterations": int(r.iterations[-1]),
                          "rare_accuracy": 100 * r.final_rare_accuracy,
                          "accuracy": 100 * r.final_accuracy, "seconds": r.seconds,
                          "cpu_seconds": r.cpu_seconds}
                         for r in results])


def summarise(results: Sequence[RunResult], baseline: str = "erm") -> pd.DataFrame:
    """Per method: mean and std (ddof=1) over seeds of the final accuracies, in %.

    ``rare_gain_vs_erm`` is the mean over seeds of (method - ERM) on the rare class for the same
    seed (same initialisation): a paired difference. ``rare_mass`` is the sampling probability
    on the rare training images, averaged over the evaluation points and seeds.
    """
    runs = runs_table(results)
    base = runs[runs.method == baseline].set_index("seed")["rare_accuracy"]
    mass = {m: float(np.nanmean([r.rare_mass for r in results if r.method == m]))
            for m in runs.method.unique()}
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
        })
    return pd.DataFrame(rows)


def format_markdown(summary: pd.DataFrame, rare_class: int) -> str:
    """The summary as a markdown table (accuracies in %, mean ± std over seeds)."""
    header = (f"| method | beta | IS | clip | seeds | digit {rare_class} acc | overall acc | "
              f"digit {rare_class} gain vs ERM (paired) | min digit {rare_class} acc | "
              f"sampling mass on digit {rare_class} |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in summary.itertuples(index=False):
        lines.append(
            f"| {row.method} | {row.beta:g} | {'on' if row.importance_sampling else 'off'} | {row.clip} | "
            f"{row.seeds} | {row.rare_acc_mean:.1f} ± {row.rare_acc_std:.1f} | "
            f"{row.acc_mean:.1f} ± {row.acc_std:.1f} | {row.rare_gain_vs_erm:+.1f} | "
            f"{row.rare_acc_min:.1f} | {100 * row.rare_mass:.1f}% |")
    return "\n".join(lines) + "\n"


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
        style = "-" if method == "erm" or method.startswith("dro-is") else "--"
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
    write_text_atomic(paths["summary.md"], f"{header}\n\n{format_markdown(summary, split.rare_class)}")
    write_text_atomic(paths["runs.csv"], runs_table(results).to_csv(index=False, float_format="%.4f"))
    write_text_atomic(paths["curves.csv"], curves_table(results).to_csv(index=False, float_format="%.5g"))
    plot_learning_curves(results, paths["learning_curves.png"], split.rare_class,
                         title="; ".join(header.split("; ")[:2]))  # the setting, without "mean ± std"
    return paths
