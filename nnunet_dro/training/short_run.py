"""A short run of any trainer, for smoke tests, the GPU check and quick looks: one mixin, one
environment variable.

``class X_short(ShortRun, X)`` keeps everything of ``X`` and trains ``short_epochs`` epochs of
``short_iterations`` iterations (``short_val_iterations`` validation iterations each), unless
``nnUNet_dro_short_run`` says otherwise: ``EPOCHS``, ``EPOCHSxITERATIONS`` or
``EPOCHSxITERATIONSxVALIDATION``; an empty field keeps the class's value (``x2``: its epochs, 2
iterations). A class may also draw nnU-Net's ``progress.png`` less often (``short_plot_every``):
drawing it costs 1-4 s of a busy CPU core, more than a short epoch, and no result depends on it.
The lab's CPU-budget trainers are short runs too (:mod:`nnunet_dro.lab.budget`, their class
values the benchmark's budget), so one variable shortens every one of them. The shipped
trainers train the budget of their class, as nnU-Net's do, and refuse to start while the variable
is set (:func:`refuse_unread_short_run`) rather than ignore it.

>>> short_run_sizes("3", (2, 3, 1)), short_run_sizes("1x2", (2, 3, 1)), short_run_sizes("x5x2", (2, 3, 1))
((3, 3, 1), (1, 2, 1), (2, 5, 2))
>>> short_run_sizes("", (120, 25, 3))
(120, 25, 3)
>>> short_run_sizes("0", (2, 3, 1))
Traceback (most recent call last):
...
RuntimeError: nnUNet_dro_short_run='0': expected EPOCHS[xITERATIONS[xVALIDATION]], positive integers
"""
from __future__ import annotations

import os
from typing import Tuple

import torch

#: the one environment variable of every short run: EPOCHS[xITERATIONS[xVALIDATION]]
SHORT_RUN_ENV = "nnUNet_dro_short_run"


def short_run_sizes(text: str, defaults: Tuple[int, int, int]) -> Tuple[int, int, int]:
    """(epochs, iterations per epoch, validation iterations per epoch) from ``text`` (the
    variable's value), each empty or missing field taken from ``defaults``."""
    fields = text.strip().lower().split("x") if text.strip() else []
    try:
        values = [int(f) if f.strip() else None for f in fields]
    except ValueError:
        values = [0]
    if len(values) > 3 or any(v is not None and v < 1 for v in values):
        raise RuntimeError(f"{SHORT_RUN_ENV}={text!r}: expected EPOCHS[xITERATIONS[xVALIDATION]], positive integers")
    values += [None] * (3 - len(values))
    return tuple(d if v is None else v for v, d in zip(values, defaults))  # type: ignore[return-value]


def short_run_value(epochs: int | None = None, iterations: int | None = None, validation: int | None = None) -> str:
    """The variable's value for these sizes (None: the class's own).

    >>> short_run_value(1, 2), short_run_value(iterations=4), short_run_value(2, 3, 1)
    ('1x2', 'x4', '2x3x1')
    """
    fields = ["" if v is None else str(int(v)) for v in (epochs, iterations, validation)]
    while fields and not fields[-1]:
        fields.pop()
    return "x".join(fields)


def refuse_unread_short_run(trainer) -> None:
    """Stop a trainer that is not a :class:`ShortRun` when ``nnUNet_dro_short_run`` is set: it would
    ignore the variable and train its full budget. As in nnU-Net, whose short runs are classes of
    their own (``nnUNetTrainer_5epochs``), a budget belongs to the class; the variable only resizes
    the classes built to be short (the test-sized trainers, the lab's CPU-budget ones).

    >>> os.environ[SHORT_RUN_ENV] = "2"
    >>> refuse_unread_short_run(object())
    Traceback (most recent call last):
    ...
    RuntimeError: nnUNet_dro_short_run='2' is read only by short-run trainers (class X(ShortRun, object) of ...
    >>> del os.environ[SHORT_RUN_ENV]; refuse_unread_short_run(object())
    """
    value = os.environ.get(SHORT_RUN_ENV, "")
    if value.strip() and not isinstance(trainer, ShortRun):
        name = type(trainer).__name__
        budget = (f" ({trainer.num_epochs} epochs of {trainer.num_iterations_per_epoch} iterations)"
                  if hasattr(trainer, "num_epochs") and hasattr(trainer, "num_iterations_per_epoch") else "")
        raise RuntimeError(f"{SHORT_RUN_ENV}={value!r} is read only by short-run trainers (class X(ShortRun, {name}) "
                           f"of nnunet_dro.training.short_run) and {name} trains its full budget{budget}; unset "
                           f"{SHORT_RUN_ENV}, or train a short-run subclass")


class ShortRun:
    """Mixin: the sizes of the module docstring. Put it *first* in the bases."""

    short_epochs: int = 2
    short_iterations: int = 3
    short_val_iterations: int = 1
    #: nnU-Net's progress.png after every epoch (None, as nnU-Net), after the last only (0), or
    #: after every N-th epoch and the last (N)
    short_plot_every: int | None = None

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs, self.num_iterations_per_epoch, self.num_val_iterations_per_epoch = short_run_sizes(
            os.environ.get(SHORT_RUN_ENV, ""), (self.short_epochs, self.short_iterations, self.short_val_iterations))

    def on_epoch_end(self):
        epoch, logger = self.current_epoch, self.logger
        every = self.short_plot_every
        if every is not None and epoch != self.num_epochs - 1 and (every == 0 or (epoch + 1) % every):
            logger.plot_progress_png = lambda output_folder: None  # this epoch only: shadows the method
        try:
            super().on_epoch_end()
        finally:
            logger.__dict__.pop("plot_progress_png", None)
