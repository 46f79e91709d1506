"""A synthetic BraTS-like cohort: 4 MRI-like channels, nested tumour labels, site effects.

Each case is a skull-stripped brain (white matter, cortical grey matter ribbon, ventricles) with
one tumour: peritumoral edema around a tumour core; high-grade cases (HGG) have a necrotic
centre inside an enhancing rim, low-grade cases (LGG) a non-enhancing core and only sometimes a
small enhancing focus. Channels follow nnU-Net's BraTS order (T1, T1ce, T2, Flair) and their
tissue contrasts mimic those sequences (CSF bright on T2 and dark on Flair, edema bright on
Flair, enhancing tumour bright on T1ce).

Labels are written in nnU-Net's converted BraTS convention (the same as ``convert-brats19``):
1 edema, 2 necrosis / non-enhancing core, 3 enhancing tumour, trained as regions whole tumour
(1, 2, 3), tumour core (2, 3), enhancing tumour (3); evaluate with ``-regions brats-nnunet``.

Sites (column ``centre``): ``site_A`` and ``site_B`` are common in training; ``site_C`` is rare
in training (5 percent by default) but a third of the test set, and its scanner differs: other
gamma per channel, weaker contrast enhancement and Flair edema contrast, stronger noise and bias
field. Grade (column ``grade``) is HGG with probability 0.7 in both splits.

Example::

    cases = generate_brats_cohort(n_train=6, n_test=3, size=32, seed=0)
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from nnunet_dro.data.brats import CHANNEL_NAMES, REGION_LABELS, REGIONS_CLASS_ORDER, legacy_to_nnunet
from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.synthetic_common import (
    CohortSpec,
    SyntheticCase,
    assign_groups,
    case_rng,
    check_cohort_size,
    ellipsoid,
    finish_intensity,
    grid,
    random_warp,
    write_cohort,
)

SITES = ("site_A", "site_B", "site_C")
DEFAULT_TRAIN_FRACTIONS = {"site_A": 0.55, "site_B": 0.40, "site_C": 0.05}
DEFAULT_TEST_FRACTIONS = {"site_A": 1 / 3, "site_B": 1 / 3, "site_C": 1 / 3}
HGG_PROBABILITY = 0.7
FIELD_OF_VIEW_MM = 180.0

# Tissue classes of the drawing (legacy BraTS tumour labels 1, 2, 4 plus healthy tissues).
BACKGROUND, NECROSIS, EDEMA, ENHANCING, CSF, GM, WM = 0, 1, 2, 4, 10, 11, 12
# Mean intensity per class and channel (T1, T1ce, T2, Flair).
CONTRASTS = {
    BACKGROUND: (0.0, 0.0, 0.0, 0.0),
    CSF: (0.25, 0.25, 1.00, 0.12),
    GM: (0.55, 0.55, 0.55, 0.55),
    WM: (0.80, 0.80, 0.38, 0.45),
    EDEMA: (0.55, 0.55, 0.85, 0.95),
    NECROSIS: (0.35, 0.40, 0.95, 0.60),
    ENHANCING: (0.55, 1.00, 0.70, 0.75),
}
# Per site: (gamma per channel, enhancement kept, Flair edema contrast kept, noise sd, bias).
SITE_PROFILES = {
    "site_A": ((1.0, 1.0, 1.0, 1.0), 1.0, 1.0, 0.03, 0.10),
    "site_B": ((0.85, 0.9, 1.1, 0.9), 0.95, 0.95, 0.04, 0.18),
    "site_C": ((1.6, 1.4, 0.7, 1.5), 0.55, 0.6, 0.06, 0.35),
}


def render_brats_case(rng: np.random.Generator, size: int, grade: str,
                      site: str) -> tuple[list[np.ndarray], np.ndarray]:
    """Draw one case: four float32 channels and the legacy BraTS label map (0, 1, 2, 4)."""
    coords = random_warp(rng, grid(size), amplitude=0.04, max_rotation_deg=8.0, max_shift=0.04)
    z, y, x = coords
    tissue = np.full((size,) * 3, BACKGROUND, dtype=np.uint8)
    brain_distance = np.sqrt(ellipsoid(coords, (0.0, 0.0, 0.0), (0.70, 0.86, 0.68)))
    brain = brain_distance < 1.0
    tissue[brain] = WM
    tissue[brain & (brain_distance > 0.86)] = GM
    tissue[brain & (brain_distance > 0.95)] = CSF
    for side in (-1.0, 1.0):
        tissue[ellipsoid((z - 0.25 * y ** 2, y, x), (0.12, 0.0, side * 0.14),
                         (0.10, 0.38, 0.07)) < 1.0] = CSF

    # The tumour: its own irregular shape (a second, stronger warp), nested classes.
    tz, ty, tx = random_warp(rng, coords, amplitude=0.07, max_rotation_deg=30.0, max_shift=0.0)
    centre = (rng.uniform(-0.2, 0.35), rng.uniform(-0.45, 0.45),
              rng.choice([-1.0, 1.0]) * rng.uniform(0.18, 0.38))
    edema_radius = rng.uniform(0.20, 0.34)
    core_radius = edema_radius * rng.uniform(0.45, 0.65)
    distance = np.sqrt(ellipsoid((tz, ty, tx), centre,
                                 (1.0, rng.uniform(0.8, 1.2), rng.uniform(0.8, 1.2))))
    label = np.zeros_like(tissue)
    label[brain & (distance < edema_radius)] = EDEMA
    core = brain & (distance < core_radius)
    if grade == "HGG":
        label[core] = ENHANCING
        label[brain & (distance < core_radius * rng.uniform(0.45, 0.7))] = NECROSIS
    else:
        label[core] = NECROSIS  # non-enhancing tumour core
        if rng.random() < 0.3:
            focus = ellipsoid((tz, ty, tx), tuple(np.add(centre, rng.normal(0, 0.03, 3))),
                              (core_radius * 0.4,) * 3) < 1.0
            label[core & focus] = ENHANCING
    tissue[label > 0] = label[label > 0]
    return _channels(rng, tissue, site), label


def _channels(rng: np.random.Generator, tissue: np.ndarray, site: str) -> list[np.ndarray]:
    gammas, enhancement, flair_edema, noise_sd, bias = SITE_PROFILES[site]
    channels = []
    for channel in range(4):
        means = {k: v[channel] * (1.0 + rng.normal(0.0, 0.04)) if k else 0.0
                 for k, v in CONTRASTS.items()}
        if channel == 1:  # T1ce: how much brighter enhancing tumour is than white matter
            means[ENHANCING] = means[WM] + enhancement * (means[ENHANCING] - means[WM])
        if channel == 3:  # Flair: edema against white matter
            means[EDEMA] = means[WM] + flair_edema * (means[EDEMA] - means[WM])
        lookup = np.zeros(max(CONTRASTS) + 1, dtype=np.float32)
        for key, value in means.items():
            lookup[key] = max(value, 0.0)
        image = lookup[tissue] ** gammas[channel]
        channels.append(finish_intensity(rng, image, tissue > 0, noise_sd, bias))
    return channels


def generate_brats_cohort(n_train: int = 40, n_test: int = 30, size: int = 32, seed: int = 0,
                          train_fractions: Mapping[str, float] = DEFAULT_TRAIN_FRACTIONS,
                          test_fractions: Mapping[str, float] = DEFAULT_TEST_FRACTIONS
                          ) -> list[SyntheticCase]:
    """Generate the cases in memory, labels already in nnU-Net's convention (0..3).

    >>> cases = generate_brats_cohort(n_train=3, n_test=2, size=24, seed=0)
    >>> len(cases[0].channels), sorted(set(np.unique(cases[0].label)) - {0, 1, 2, 3})
    (4, [])
    """
    check_cohort_size(n_train, n_test, size)
    cases = []
    for index, (split, site) in enumerate(
            assign_groups(seed, n_train, n_test, train_fractions, test_fractions)):
        rng = case_rng(seed, index)
        grade = "HGG" if rng.random() < HGG_PROBABILITY else "LGG"
        channels, legacy = render_brats_case(rng, size, grade, site)
        cases.append(SyntheticCase(case=f"brats_{index:03d}", split=split, channels=channels,
                                   label=legacy_to_nnunet(legacy),
                                   groups={"centre": site, "grade": grade}))
    return cases


def make_brats_dataset(target: DatasetTarget, cohort: CohortSpec = CohortSpec()) -> Path:
    """Generate the ``cohort`` and write it to ``target`` (``$nnUNet_raw/DatasetXXX_<name>``); return the folder."""
    train_fractions, test_fractions = cohort.fractions(DEFAULT_TRAIN_FRACTIONS, DEFAULT_TEST_FRACTIONS)
    cases = generate_brats_cohort(cohort.n_train, cohort.n_test, cohort.size, cohort.seed, train_fractions,
                                  test_fractions)
    return write_cohort(cases, target, channel_names=CHANNEL_NAMES, labels=REGION_LABELS,
                        regions_class_order=REGIONS_CLASS_ORDER, spacing_mm=FIELD_OF_VIEW_MM / cohort.size,
                        description=f"synthetic BraTS-like cohort (seed {cohort.seed}, {cohort.n_train} train / "
                                    f"{cohort.n_test} test, {cohort.size}^3)")
