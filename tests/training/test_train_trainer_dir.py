"""`nnunet_dro trainer-dir` and nnU-Net's own nnUNet_extTrainer lookup of our trainers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import nnunet_dro.training as training
from nnunet_dro.lab.variants import LAB_VARIANTS
from nnunet_dro.training.registry import BASES, LAB_ONLY
from nnunet_dro.weighting.settings import AdaptiveHardnessSettings, HardnessSettings

#: every trainer class by name: the product's (bases included) and the lab's variants
EVERY = {**training.TRAINERS, **LAB_VARIANTS}

BIN = Path(sys.executable).parent


def ext_trainer_env() -> dict:
    """This environment with nnUNet_extTrainer set to what ``nnunet_dro trainer-dir`` prints."""
    folder = subprocess.run([str(BIN / "nnunet_dro"), "trainer-dir"], capture_output=True, text=True,
                            check=True).stdout.strip()
    return {**os.environ, "nnUNet_extTrainer": folder}


@pytest.mark.parametrize("command", [[str(BIN / "nnunet_dro"), "trainer-dir"],
                                     [sys.executable, "-m", "nnunet_dro", "trainer-dir"]],
                         ids=["console-script", "python-m"])
def test_trainer_dir_prints_the_shim_folder(command):
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    folder = Path(proc.stdout.strip())
    assert folder.is_dir() and folder.is_absolute()
    assert (folder / "nnunet_dro_trainers.py").is_file()


def test_the_product_holds_product_trainers_only():
    """``nnunet_dro.training`` exports the trainers a user runs with ``-tr`` and nothing of the lab:
    no CPU-budget twin, no second name for another results folder."""
    trainers = [n for n in training.__all__ if n.startswith("nnUNetTrainer")]
    assert trainers == sorted(training.PRODUCT_TRAINERS) and "nnUNetTrainerDROAdaptive" in trainers
    assert not [n for n in trainers if n.endswith(("_CPUBudget", "_repeat", "_JTT")) or "_CPUBudget" in n]
    assert all(training.TRAINERS[n].__module__.startswith("nnunet_dro.training") for n in trainers)
    # one table of docs/training.md: no base class, no ablation arm of the lab
    assert not set(trainers) & (set(BASES) | set(LAB_ONLY) | set(LAB_VARIANTS)) and 8 <= len(trainers) <= 14


def test_the_trainer_dir_does_not_find_the_labs_trainers():
    """nnU-Net's own lookup through ``nnunet_dro trainer-dir`` alone finds no CPU-budget twin."""
    code = ("from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name as find\n"
            "try:\n    find('nnUNetTrainerDROAdaptive_CPUBudget')\nexcept RuntimeError:\n    print('NOT FOUND')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ext_trainer_env(),
                          timeout=300)
    assert proc.returncode == 0 and "NOT FOUND" in proc.stdout, proc.stderr[-3000:]


def test_nnunet_lookup_finds_every_trainer_through_ext_trainer_folder():
    """nnU-Net imports the shim as a top-level module; the classes it returns are ours."""
    names = [n for n in training.__all__ if n.startswith("nnUNetTrainer")]
    code = (
        "import sys\n"
        "from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name as find\n"
        "for name in sys.argv[1:]:\n"
        "    cls = find(name)\n"
        "    assert cls.__name__ == name and cls.__module__.startswith('nnunet_dro.training'), cls\n"
        "    print('FOUND', name)\n"
    )
    env = ext_trainer_env()
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [l for l in proc.stdout.splitlines() if l.startswith("FOUND")] == [f"FOUND {n}" for n in names]


def _check_keeps_nnunet_signature_and_sets_only_attributes(cls, base_name):
    """nnU-Net records the constructor's arguments by name: every trainer keeps its signature, and a
    variant (any class but ``base_name``) defines no method, only attributes."""
    import inspect

    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    assert list(inspect.signature(cls.__init__).parameters) == list(inspect.signature(nnUNetTrainer.__init__).parameters)
    if cls.__name__ != base_name:
        assert "__init__" not in vars(cls) and not [k for k, v in vars(cls).items() if callable(v)]
        unknown = sorted(k for k in vars(cls) if k not in VARIANT_ATTRIBUTES and not (k.startswith("__") and k.endswith("__")))
        assert not unknown, f"{cls.__name__} sets {unknown}: a variant sets only {sorted(VARIANT_ATTRIBUTES)}"


#: what a variant file's class may set (attributes only): the settings of its scheme, the optimiser
#: and the reporting attributes; anything else (a method, a property, another dro_* attribute) fails
VARIANT_ATTRIBUTES = frozenset({"dro_settings", "gils_settings", "sgd_momentum", "sgd_nesterov",
                                "dro_num_hardest_logged", "dro_write_report_every_epoch",
                                "dro_progress_time_fraction"})


def test_every_discovered_variant_only_sets_attributes():
    """Every file of ``training/variants/`` and of ``lab/variants/`` (found, not listed): a variant
    that defines a method fails here."""
    from nnunet_dro.training.variants import VARIANTS

    assert len(VARIANTS) >= 2 and len(LAB_VARIANTS) >= 20 and not set(VARIANTS) & set(LAB_VARIANTS)
    for name, cls in {**VARIANTS, **LAB_VARIANTS}.items():
        _check_keeps_nnunet_signature_and_sets_only_attributes(cls, base_name=None)
        assert cls.__name__ == name and EVERY[name] is cls


def test_variants_only_set_attributes_and_keep_nnunet_constructor_signature():
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

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
        cls = EVERY[name]
        assert issubclass(cls, training.nnUNetTrainerDRO)
        settings = cls.dro_settings
        assert type(settings) is HardnessSettings, name
        assert (settings.beta, settings.importance.enabled, cls.sgd_momentum) == (beta, importance_sampling, momentum)
        assert settings.importance.clip == (0.1, 10.0)
        _check_keeps_nnunet_signature_and_sets_only_attributes(cls, "nnUNetTrainerDRO")
    erm = EVERY["nnUNetTrainer_SGDnoMomentum"]
    assert issubclass(erm, nnUNetTrainer) and not issubclass(erm, training.nnUNetTrainerDRO)
    assert erm.sgd_momentum == 0.0 and erm.sgd_nesterov is False


# name -> (f, importance sampling, largest p as a multiple of 1/n, beta rule, uniform fraction of epochs, smoothing,
# uniform until every structure's pseudo-Dice reaches).
# The variants keep the settings the evidence tables measured them with (no cap) although the default
# gained the cap: a name must keep meaning what the benchmark says it did.
ADAPTIVE_VARIANTS = {
    "nnUNetTrainerDROAdaptive": (0.5, False, 5.0, "perplexity", 0.0, 1.0, 0.2),
    "nnUNetTrainerDROAdaptive_fromStart": (0.5, False, 5.0, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f25_noIS_cap5": (0.25, False, 5.0, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_noIS": (0.5, False, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f25": (0.25, True, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f50": (0.5, True, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f75": (0.75, True, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f90": (0.9, True, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f25_noIS": (0.25, False, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f75_noIS": (0.75, False, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_f90_noIS": (0.9, False, None, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_noIS_smooth25": (0.5, False, None, "perplexity", 0.0, 0.25, None),
    "nnUNetTrainerDROAdaptive_warm50": (0.5, True, None, "perplexity", 0.5, 1.0, None),
    "nnUNetTrainerDROAdaptive_warm50_noIS": (0.5, False, None, "perplexity", 0.5, 1.0, None),
    "nnUNetTrainerDROAdaptive_kappa1": (0.5, False, None, "spread", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_noGuard": (0.5, False, 5.0, "perplexity", 0.0, 1.0, None),
    "nnUNetTrainerDROAdaptive_trim5": (0.5, False, 5.0, "perplexity", 0.0, 1.0, 0.2),
    "nnUNetTrainerDROAdaptive_f25_ermPhase": (0.25, False, 5.0, "perplexity", 0.0, 1.0, 0.2),
}
#: the outlier trim (fraction of the hardest cases drawn at the uniform rate); 0 for every other variant
TRIM_FRACTIONS = {"nnUNetTrainerDROAdaptive_trim5": 0.05}


@pytest.mark.parametrize("name", sorted(ADAPTIVE_VARIANTS))
def test_adaptive_variants_keep_the_settings_they_were_measured_with(name):
    cls = EVERY[name]
    s = cls.dro_settings
    got = (s.fraction, s.importance.enabled, s.max_weight, s.rule, s.uniform_until, s.loss_smoothing,
           s.uniform_until_learned)
    assert got == ADAPTIVE_VARIANTS[name]
    assert s.trim_fraction == TRIM_FRACTIONS.get(name, 0.0)
    assert type(s) is AdaptiveHardnessSettings and s.scheme == "kl_adaptive" and s.beta_max == 100.0
    _check_keeps_nnunet_signature_and_sets_only_attributes(cls, "nnUNetTrainerDROAdaptive")


@pytest.mark.parametrize("where", ["product", "lab"])
def test_a_variant_is_one_class_in_one_file(where):
    """Adding a variant is adding one file to nnunet_dro/training/variants/ (the product's: exported,
    found by nnU-Net's -tr lookup through trainer-dir) or to nnunet_dro/lab/variants/ (an ablation
    arm: not exported); either way, in the lab it has its CPU-budget twin (found through the lab's
    trainer folders) and is a benchmark arm."""
    from nnunet_dro.lab import variants as lab_variants
    from nnunet_dro.lab.ext_trainers import lab_trainer_dirs
    from nnunet_dro.training import variants

    name = f"nnUNetTrainerDROAdaptive_f60_testOnly{where.title()}"
    path = Path((variants if where == "product" else lab_variants).__file__).parent / f"{name}.py"
    path.write_text("from dataclasses import replace\n\n"
                    "from nnunet_dro.training.trainer import nnUNetTrainerDROAdaptive\n\n\n"
                    f"class {name}(nnUNetTrainerDROAdaptive):\n"
                    "    dro_settings = replace(nnUNetTrainerDROAdaptive.dro_settings, fraction=0.6)\n")
    code = (
        "import sys\n"
        "from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name as find\n"
        "import nnunet_dro.training as training\n"
        "from nnunet_dro.lab.arm_runs import ARM_TRAINERS\n"
        "name, where = sys.argv[1:]\n"
        "assert (name in training.__all__) == (where == 'product') and name + '_CPUBudget' not in training.__all__\n"
        "assert find(name).dro_settings.fraction == 0.6 and find(name).__name__ == name\n"
        "twin = find(name + '_CPUBudget')\n"
        "assert twin.dro_settings.fraction == 0.6 and twin.budget_epochs == 120\n"
        "assert ARM_TRAINERS[name[len('nnUNetTrainer'):]] == name + '_CPUBudget'\n"
        "print('REACHABLE')\n"
    )
    env = {**os.environ, "nnUNet_extTrainer": os.pathsep.join(lab_trainer_dirs())}
    try:
        proc = subprocess.run([sys.executable, "-c", code, name, where], capture_output=True, text=True, env=env,
                              timeout=300)
    finally:
        path.unlink()
    assert proc.returncode == 0 and "REACHABLE" in proc.stdout, proc.stderr[-3000:]


#: how a token of a product trainer's name reads: the ``dro_settings`` field it changes from its
#: base's and the value it names (a new token joins here with its field)
NAME_TOKENS = {
    r"f(\d+)": ("fraction", lambda digits: int(digits) / 100),
    r"trim(\d+)": ("trim_fraction", lambda digits: int(digits) / 100),
    r"beta(\d+)": ("beta", float),
    r"cap(\d+)": ("max_weight", float),
    r"warm(\d+)": ("uniform_until", lambda digits: int(digits) / 100),
    r"refresh(\d+)": ("refresh_at", lambda digits: int(digits) / 100),
}
#: tokens that name a scheme of its own on the base's ERM phase and guard (the settings' type)
SCHEME_TOKENS = {"errorSet": "ErrorSetSettings"}
#: tokens that change no setting of the base, and why the name carries them
NAME_MARKERS = {
    # the lab's _f25 arm (from _fromStart, importance weights on, no cap) is another trainer in the
    # record; this one keeps the default's ERM phase, which the token says
    "ermPhase": "nnUNetTrainerDROAdaptive_f25_ermPhase",
}
#: product trainers named before this rule, under the record's arm names (renamed with the record)
NAMED_BY_THE_RECORD = {
    # GI-LS (the lab's DROLS, uniform draws) on the default's sampling: the decision record's DROLS_DRO
    "nnUNetTrainerDROLS_DRO": "nnUNetTrainerDROAdaptive",
}


def _product_parent(cls) -> type | None:
    """The nearest product trainer ``cls`` derives from (None: it derives from a base only)."""
    return next((c for c in cls.__mro__[1:] if c.__name__ in training.PRODUCT_TRAINERS), None)


@pytest.mark.parametrize("name", sorted(training.PRODUCT_TRAINERS))
def test_a_product_trainers_name_is_its_base_and_one_token_per_changed_setting(name):
    """A product trainer is either a scheme of its own (its ``dro_settings`` of another type than its
    product base's, or no product base: ``nnUNetTrainerDRO``, ``nnUNetTrainerGroupDRO``, ...) or its
    product base's name, ``_`` and one token per ``dro_settings`` field it changes, each token naming
    the new value (``nnUNetTrainerDROAdaptive_trim5``: ``trim_fraction = 0.05``)."""
    import re
    from dataclasses import fields

    cls = training.PRODUCT_TRAINERS[name]
    parent = _product_parent(cls)
    if name in NAMED_BY_THE_RECORD:
        assert parent.__name__ == NAMED_BY_THE_RECORD[name]
        return
    if parent is None or not name.startswith(parent.__name__ + "_"):
        assert parent is None or type(cls.dro_settings) is not type(parent.dro_settings), \
            f"{name} derives from {parent.__name__} with the same scheme: name it {parent.__name__}_<token>"
        return
    ours, theirs = cls.dro_settings, parent.dro_settings
    if type(ours) is not type(theirs):  # a scheme of its own: the one token names it
        token = name[len(parent.__name__) + 1:]
        assert SCHEME_TOKENS.get(token) == type(ours).__name__, \
            f"{name}: a scheme of its own ({type(ours).__name__}) on {parent.__name__}: its token is not in SCHEME_TOKENS"
        return
    changed = {f.name: getattr(ours, f.name) for f in fields(ours) if getattr(ours, f.name) != getattr(theirs, f.name)}
    read = {}
    for token in name[len(parent.__name__) + 1:].split("_"):
        if NAME_MARKERS.get(token) == name:
            continue
        match = [(field, value(m.group(1))) for pattern, (field, value) in NAME_TOKENS.items()
                 for m in [re.fullmatch(pattern, token)] if m]
        assert match, f"{name}: token {token!r} names no setting (NAME_TOKENS)"
        read.update(match)
    assert read == changed, f"{name} reads as {read} against {parent.__name__}; its dro_settings change {changed}"
