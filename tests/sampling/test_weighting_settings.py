"""The settings dataclasses of nnunet_dro.weighting.settings: validation, replace(), and the one to
one mapping onto the weighting classes (building a settings object gives its class with the same
parameters)."""
from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, replace

import numpy as np
import pytest

from nnunet_dro import weighting
from nnunet_dro.weighting import (
    SETTINGS_CLASSES,
    AdaptiveHardnessSettings,
    AdaptiveHardnessWeighting,
    Chi2HardnessSettings,
    Chi2HardnessWeighting,
    FixedWeighting,
    FixedWeightSettings,
    GroupBalancedSettings,
    GroupBalancedWeighting,
    GroupDROSettings,
    GroupDROWeighting,
    HardnessSettings,
    HardnessWeighting,
    ImportanceSettings,
    KLReweighting,
    KLReweightSettings,
)
from nnunet_dro.weighting.error_set import ErrorSetWeighting
from nnunet_dro.weighting.settings import DEFAULT_INIT_LOSS, ErrorSetSettings


def test_one_settings_class_per_weighting_class_and_every_scheme_once():
    classes = {s.weighting_class for s in SETTINGS_CLASSES}
    assert classes == {HardnessWeighting, AdaptiveHardnessWeighting, Chi2HardnessWeighting, KLReweighting,
                       FixedWeighting, GroupBalancedWeighting, GroupDROWeighting, ErrorSetWeighting}
    assert len(classes) == len(SETTINGS_CLASSES)
    schemes = [s.scheme for s in SETTINGS_CLASSES]
    assert len(set(schemes)) == len(schemes) and all(schemes)
    for name in ("HardnessSettings", "AdaptiveHardnessSettings", "GroupDROSettings", "ImportanceSettings"):
        assert name in weighting.__all__


def test_settings_are_frozen_and_keyword_only():
    s = HardnessSettings()
    with pytest.raises(FrozenInstanceError):
        s.beta = 10.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        HardnessSettings(10.0)  # type: ignore[misc]


def test_replace_keeps_the_base_and_validates_the_copy():
    base = AdaptiveHardnessSettings(fraction=0.5, max_weight=5.0, guard=True)
    variant = replace(base, fraction=0.25)
    assert (variant.fraction, variant.max_weight, variant.guard) == (0.25, 5.0, True)
    assert base.fraction == 0.5
    with pytest.raises(ValueError, match=r"^AdaptiveHardnessSettings\.fraction = 0\.0: expected 0 < fraction <= 1$"):
        replace(base, fraction=0.0)


@pytest.mark.parametrize("cls, field_name, value", [
    (HardnessSettings, "beta", 0.0),
    (HardnessSettings, "beta", float("inf")),
    (HardnessSettings, "loss_smoothing", 0.0),
    (HardnessSettings, "init_loss", -1.0),
    (HardnessSettings, "seed", 1.5),
    (HardnessSettings, "warmup", 1),
    (HardnessSettings, "importance", True),
    (Chi2HardnessSettings, "beta", -10.0),
    (AdaptiveHardnessSettings, "fraction", 1.5),
    (AdaptiveHardnessSettings, "beta_max", 0.0),
    (AdaptiveHardnessSettings, "rule", "softmax"),
    (AdaptiveHardnessSettings, "kappa", 0.0),
    (AdaptiveHardnessSettings, "max_weight", 0.5),
    (AdaptiveHardnessSettings, "uniform_until", 1.5),
    (AdaptiveHardnessSettings, "uniform_until_learned", -0.1),
    (AdaptiveHardnessSettings, "trim_fraction", 1.0),
    (AdaptiveHardnessSettings, "guard", "yes"),
    (AdaptiveHardnessSettings, "guard_recover", 0.0),
    (KLReweightSettings, "schedule", ((0.5, 1.0),)),
    (KLReweightSettings, "schedule", ((0.0, 1.0), (0.0, 0.1))),
    (KLReweightSettings, "momentum", 0.0),
    (KLReweightSettings, "clip", (2.0, 1.0)),
    (GroupBalancedSettings, "column", ""),
    (GroupDROSettings, "eta", 0.0),
])
def test_an_invalid_value_is_one_clear_line_naming_the_field_and_the_value(cls, field_name, value):
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{field_name} = {__import__('re').escape(repr(value))}: "
                                         rf"expected [^\n]+$"):
        cls(**{field_name: value})


def test_fields_of_one_scheme_do_not_exist_on_another():
    """What one scheme would silently ignore cannot be written on it."""
    adaptive_only = {"fraction", "beta_max", "rule", "kappa", "max_weight", "uniform_until", "uniform_until_learned",
                     "trim_fraction", "guard", "guard_recover", "guard_escalate"}
    for cls in SETTINGS_CLASSES:
        names = {f.name for f in dataclasses.fields(cls)}
        if cls is ErrorSetSettings:  # the default's ERM phase and guard, acting on the error set's draws
            assert names & adaptive_only == {"uniform_until_learned", "guard", "guard_recover", "guard_escalate"}
        elif cls is not AdaptiveHardnessSettings:
            assert not names & adaptive_only, cls
        if cls not in (GroupBalancedSettings, GroupDROSettings):
            assert "column" not in names, cls
        if cls not in (HardnessSettings, Chi2HardnessSettings):
            assert "beta" not in names, cls
    with pytest.raises(TypeError, match="uniform_until"):
        replace(HardnessSettings(), uniform_until=0.5)
    with pytest.raises(TypeError, match="eta"):
        GroupBalancedSettings(eta=0.1)  # type: ignore[call-arg]


def test_hardness_settings_build_the_fixed_beta_scheme_with_the_same_parameters():
    importance = ImportanceSettings(enabled=True, clip=(0.2, 5.0), first_draw_one=True)
    s = HardnessSettings(beta=10.0, importance=importance, warmup=True, loss_smoothing=0.5, init_loss=7.0, seed=3)
    w = s.build(5, rank=2, shared=False)
    try:
        assert type(w) is HardnessWeighting
        assert w.current_beta == 10.0 and w.importance == importance and w.loss_smoothing == 0.5
        np.testing.assert_allclose(w.losses, np.full(5, 7.0), atol=1e-3)  # L_init, jittered to break ties
        # seed + rank: the same draws as a weighting built directly with seed 5
        direct = HardnessWeighting(5, beta=10.0, init_loss=7.0, importance=importance, seed=5, warmup=True,
                                   loss_smoothing=0.5)
        try:
            assert w.sample_with_beta(4)[0].tolist() == direct.sample_with_beta(4)[0].tolist()
        finally:
            direct.close()
    finally:
        w.close()


def test_init_loss_none_is_the_default_l_init():
    w = Chi2HardnessSettings().build(3, shared=False)
    try:
        assert type(w) is Chi2HardnessWeighting and w.current_beta == 10.0
        np.testing.assert_allclose(w.losses, np.full(3, DEFAULT_INIT_LOSS), atol=1e-3)
    finally:
        w.close()


def test_adaptive_settings_build_the_scale_free_scheme_with_the_same_parameters():
    s = AdaptiveHardnessSettings(fraction=0.25, beta_max=50.0, rule="spread", kappa=2.0, max_weight=3.0,
                                 uniform_until=0.1, uniform_until_learned=0.2, trim_fraction=0.1, seed=0)
    w = s.build(20, shared=False)
    try:
        assert type(w) is AdaptiveHardnessWeighting
        assert (w.fraction, w.beta_max, w.rule, w.kappa, w.max_weight, w.uniform_until, w.trim_fraction) == \
            (0.25, 50.0, "spread", 2.0, 3.0, 0.1, 0.1)
        assert w.held_uniform  # uniform_until_learned set: held until the trainer releases it
    finally:
        w.close()
    w = replace(s, uniform_until_learned=None).build(20, shared=False)
    try:
        assert not w.held_uniform
    finally:
        w.close()


def test_table_and_reweighting_settings_build_their_classes():
    rw = KLReweightSettings(schedule=((0.0, 1.0), (0.5, 0.1)), momentum=0.25, clip=(0.1, 10.0)).build(4)
    assert type(rw) is KLReweighting
    assert (rw.reweighter.schedule, rw.reweighter.momentum, rw.reweighter.clip) == \
        (((0.0, 1.0), (0.5, 0.1)), 0.25, (0.1, 10.0))
    fixed = FixedWeightSettings(seed=1).build([1.0, 2.0, 3.0], shared=False)
    assert type(fixed) is FixedWeighting and fixed.case_weights.tolist() == [1.0, 2.0, 3.0]
    balanced = GroupBalancedSettings(column="centre").build(["a", "a", "b"], shared=False)
    assert type(balanced) is GroupBalancedWeighting and balanced.group_names == ["a", "b"]
    dro = GroupDROSettings(eta=0.2).build(["a", "b", "b"], shared=False)
    assert type(dro) is GroupDROWeighting and dro.eta == 0.2
    for w in (fixed, balanced, dro):
        w.close()


def test_as_dict_is_plain_values_naming_the_settings():
    d = AdaptiveHardnessSettings(fraction=0.25).as_dict()
    assert d["settings"] == "AdaptiveHardnessSettings" and d["fraction"] == 0.25
    assert d["importance"]["enabled"] is True and isinstance(d["importance"], dict)


@pytest.mark.parametrize("settings, data", [
    (HardnessSettings(), 4), (AdaptiveHardnessSettings(), 4), (Chi2HardnessSettings(), 4), (KLReweightSettings(), 4),
    (FixedWeightSettings(), [1.0, 2.0]), (GroupBalancedSettings(), ["a", "b"]), (GroupDROSettings(), ["a", "b"]),
])
def test_the_settings_scheme_is_the_built_weightings_scheme(settings, data):
    """The checkpoint's 'scheme' (written by the weighting) names the settings that built it."""
    w = settings.build(data, shared=False)
    try:
        assert type(w) is settings.weighting_class and w.scheme == settings.scheme
    finally:
        w.close()
