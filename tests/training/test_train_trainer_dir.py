"""`nnunet_dro trainer-dir` and nnU-Net's own nnUNet_extTrainer lookup of our trainers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import nnunet_dro.training as training

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("command", [[str(BIN / "nnunet_dro"), "trainer-dir"],
                                     [sys.executable, "-m", "nnunet_dro", "trainer-dir"]],
                         ids=["console-script", "python-m"])
def test_trainer_dir_prints_the_shim_folder(command):
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    folder = Path(proc.stdout.strip())
    assert folder.is_dir() and folder.is_absolute()
    assert (folder / "nnunet_dro_trainers.py").is_file()


def test_nnunet_lookup_finds_every_trainer_through_ext_trainer_folder():
    """nnU-Net imports the shim as a top-level module; the classes it returns are ours."""
    names = [n for n in training.__all__ if n.startswith("nnUNetTrainer") and n != "nnUNetTrainerConfigurableSGD"]
    code = (
        "import sys\n"
        "from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name as find\n"
        "for name in sys.argv[1:]:\n"
        "    cls = find(name)\n"
        "    assert cls.__name__ == name and cls.__module__.startswith('nnunet_dro.training'), cls\n"
        "    print('FOUND', name)\n"
    )
    env = dict(os.environ)
    env["nnUNet_extTrainer"] = subprocess.run([str(BIN / "nnunet_dro"), "trainer-dir"], capture_output=True,
                                              text=True, check=True).stdout.strip()
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [l for l in proc.stdout.splitlines() if l.startswith("FOUND")] == [f"FOUND {n}" for n in names]


def test_variants_only_set_attributes_and_keep_nnunet_constructor_signature():
    import inspect
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    expected = list(inspect.signature(nnUNetTrainer.__init__).parameters)
    table = {
        "nnUNetTrainerDRO": (100.0, True, 0.99),
        "nnUNetTrainerDRO_beta10": (10.0, True, 0.99),
        "nnUNetTrainerDRO_beta1000": (1000.0, True, 0.99),
        "nnUNetTrainerDRO_noIS": (100.0, False, 0.99),
        "nnUNetTrainerDRO_beta10_noIS": (10.0, False, 0.99),
        "nnUNetTrainerDRO_beta1000_noIS": (1000.0, False, 0.99),
        "nnUNetTrainerDRO_SGDnoMomentum": (100.0, True, 0.0),
    }
    for name, (beta, importance_sampling, momentum) in table.items():
        cls = getattr(training, name)
        assert issubclass(cls, training.nnUNetTrainerDRO)
        assert (cls.dro_beta, cls.dro_importance_sampling, cls.sgd_momentum) == (beta, importance_sampling, momentum)
        assert cls.dro_clip == (0.1, 10.0)
        assert list(inspect.signature(cls.__init__).parameters) == expected
        if name != "nnUNetTrainerDRO":
            assert "__init__" not in vars(cls) and not [k for k, v in vars(cls).items() if callable(v)]
    erm = training.nnUNetTrainer_SGDnoMomentum
    assert issubclass(erm, nnUNetTrainer) and not issubclass(erm, training.nnUNetTrainerDRO)
    assert erm.sgd_momentum == 0.0 and erm.sgd_nesterov is False
