"""Training runs of the digits experiment: one (method, seed) run and the full grid."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import nn

from nnunet_dro.errors import UserError
from nnunet_dro.lab.experiments.digits.data import DEFAULT_BATCH_SIZE, DEFAULT_LR, DigitsSplit
from nnunet_dro.lab.experiments.digits.methods import METHODS, MethodContext, check_method_names
from nnunet_dro.lab.experiments.digits.model import SmallCNN


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
    step_seconds: float = math.nan       # wall clock of the training steps only (no evaluation)
    step_cpu_seconds: float = math.nan   # CPU time of the training steps only
    rare_weight_share: float = math.nan  # sum of the rare images' loss weights / sum of all weights

    @property
    def num_steps(self) -> int:
        return int(self.iterations[-1])

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

    context = MethodContext(split.num_train, split.y_train, seed, iterations=iterations, lr=lr,
                            model=model, inputs=x_train, targets=y_train)
    training = spec.build(context)
    step_wall = step_cpu = 0.0
    weight_total = weight_rare = 0.0
    try:
        record(0, training.sampling_probabilities())
        for iteration in range(1, iterations + 1):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            indices = training.sample(batch_size)
            batch = torch.from_numpy(indices)
            losses = context.loss_fn(model(x_train[batch]), y_train[batch])
            fresh = losses.detach().double().numpy()
            w = training.weigh(indices, fresh)
            weights = torch.from_numpy(w).to(losses.dtype)
            optimiser.zero_grad(set_to_none=True)
            (weights * losses).mean().backward()  # (1/b) sum_i w_i grad l_i, Algorithm 1 line 12
            optimiser.step()
            step_wall += time.perf_counter() - wall0
            step_cpu += time.process_time() - cpu0
            weight_total += float(w.sum())
            weight_rare += float(w[rare_train[indices]].sum())
            if iteration % eval_every == 0 or iteration == iterations:
                record(iteration, training.sampling_probabilities())
    finally:
        training.close()
    return RunResult(method, seed, np.asarray(curve["it"], dtype=np.int64), np.asarray(curve["acc"]),
                     np.asarray(curve["rare"]), np.asarray(curve["loss"]), np.asarray(curve["mass"]),
                     time.perf_counter() - start, time.process_time() - cpu_start, step_wall, step_cpu,
                     weight_rare / weight_total if weight_total > 0 else math.nan)


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
