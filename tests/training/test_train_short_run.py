"""One short-run mechanism: every test-sized or budget trainer of the repository is a ``ShortRun``
(``nnunet_dro.training.short_run``), sized by the one variable ``nnUNet_dro_short_run``; no other
code sets a trainer's epochs or iterations."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from nnunet_dro.training.short_run import SHORT_RUN_ENV, ShortRun, short_run_sizes, short_run_value

ROOT = Path(__file__).resolve().parents[2]


def test_no_other_code_sets_a_trainers_epochs_or_iterations():
    files = [p for part in ("nnunet_dro", "scripts", "tests") for p in (ROOT / part).rglob("*.py")]
    setting = re.compile(r"\bself\.num_(epochs|iterations_per_epoch|val_iterations_per_epoch)\s*=")
    found = sorted(str(p.relative_to(ROOT)) for p in files if setting.search(p.read_text()))
    assert found == ["nnunet_dro/training/short_run.py"], found


@pytest.mark.parametrize("epochs, iterations, validation", [(1, None, None), (None, 4, None), (3, 2, 1)])
def test_the_value_reads_back_as_written(epochs, iterations, validation):
    defaults = (7, 8, 9)
    expected = tuple(d if v is None else v for v, d in zip((epochs, iterations, validation), defaults))
    assert short_run_sizes(short_run_value(epochs, iterations, validation), defaults) == expected


@pytest.mark.parametrize("text", ["a", "1x2x3x4", "-1", "1x0", "1.5"])
def test_a_bad_value_names_the_variable(text):
    with pytest.raises(RuntimeError, match=SHORT_RUN_ENV):
        short_run_sizes(text, (1, 1, 1))


def _construct(ds, monkeypatch, cls):
    import torch
    from batchgenerators.utilities.file_and_folder_operations import load_json

    for key in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        monkeypatch.setenv(key, ds.env[key])
    folder = ds.preprocessed / ds.folder_name
    plans = load_json(str(folder / "nnUNetPlans.json"))
    plans["continue_training"] = False
    return cls(plans, "3d_fullres", 0, load_json(str(folder / "dataset.json")), device=torch.device("cpu"))


@pytest.mark.parametrize("name", ["nnUNetTrainerDRO", "nnUNetTrainerDROAdaptive", "nnUNetTrainerL2RW",
                                  "nnUNetTrainerDROAdaptive_errorSet"])
def test_a_shipped_trainer_refuses_the_variable_it_does_not_read(label_dataset, monkeypatch, name):
    """A shipped trainer trains its class's budget (as nnU-Net's own, whose short runs are classes):
    with the variable set it stops in one line instead of starting a full run without a word."""
    from nnunet_dro.training import TRAINERS

    monkeypatch.setenv(SHORT_RUN_ENV, "2x3")
    with pytest.raises(RuntimeError) as err:
        _construct(label_dataset, monkeypatch, TRAINERS[name])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{SHORT_RUN_ENV}='2x3' is read only by short-run trainers")
    assert f"{name} trains its full budget (1000 epochs of 250 iterations)" in message


def test_a_short_run_subclass_reads_the_variable(label_dataset, monkeypatch):
    from nnunet_dro.training import nnUNetTrainerDRO
    from nnunet_dro.training.short_run import ShortRun

    class nnUNetTrainerDRO_short(ShortRun, nnUNetTrainerDRO):
        pass

    monkeypatch.setenv(SHORT_RUN_ENV, "2x3")
    trainer = _construct(label_dataset, monkeypatch, nnUNetTrainerDRO_short)
    assert (trainer.num_epochs, trainer.num_iterations_per_epoch) == (2, 3)
    monkeypatch.delenv(SHORT_RUN_ENV)
    trainer = _construct(label_dataset, monkeypatch, nnUNetTrainerDRO)  # unset: the class's budget
    assert (trainer.num_epochs, trainer.num_iterations_per_epoch) == (1000, 250)


@pytest.mark.parametrize("every, drawn", [(None, list(range(12))), (0, [11]), (5, [4, 9, 11]), (1, list(range(12)))])
def test_progress_png_is_drawn_after_the_epochs_short_plot_every_names(every, drawn):
    """nnU-Net's on_epoch_end draws progress.png; a short run lets it through after every epoch
    (None), the last only (0) or every N-th and the last, and leaves the logger's method in place."""

    class Logger:
        def __init__(self):
            self.drawn, self.epoch = [], None

        def plot_progress_png(self, output_folder):
            self.drawn.append(self.epoch)

    class Base:  # the part of nnUNetTrainer.on_epoch_end that matters here
        def on_epoch_end(self):
            self.logger.epoch = self.current_epoch
            self.logger.plot_progress_png("folder")
            self.current_epoch += 1

    class Run(ShortRun, Base):
        short_plot_every = every

        def __init__(self):  # no nnU-Net set-up: only the epoch end is exercised
            self.num_epochs, self.logger, self.current_epoch = 12, Logger(), 0

    run = Run()
    for _ in range(12):
        run.on_epoch_end()
    assert run.logger.drawn == drawn
    assert "plot_progress_png" not in vars(run.logger)
