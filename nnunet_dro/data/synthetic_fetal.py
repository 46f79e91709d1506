"""A synthetic fetal-brain-like cohort with hidden stratification (T2-like, FeTA label numbering).

Each case is a small 3D volume drawn from a parametric brain: skull/external CSF, cortical grey
matter ribbon, white matter, lateral + third ventricles + cavum + fourth ventricle, thalami,
brainstem and a two-hemisphere cerebellum with vermis in the posterior fossa. Labels use FeTA's
numbering so ``nnunet_dro evaluate -regions feta`` scores white matter (3), intra-axial CSF (4)
and cerebellum (5):

    0 background, 1 external CSF, 2 grey matter, 3 white matter, 4 ventricles / intra-axial CSF,
    5 cerebellum, 6 deep grey matter, 7 brainstem

Conditions (column ``condition`` of subgroups.tsv):

- ``control``: normal anatomy; the majority of the training set.
- ``spina_bifida``: Chiari-II-like: enlarged ventricles (usually), a small, flattened cerebellum
  pushed down and forward into a small posterior fossa with little surrounding CSF, a faint
  cerebellum (low contrast), a narrower frontal skull ("lemon sign"), thinner external CSF.
- ``other``: Dandy-Walker-like posterior fossa cyst (intra-axial CSF) that splits the cerebellar
  hemispheres and shrinks the vermis, asymmetric ventricles, often a periventricular white matter
  cyst.

Gestational age (20-35 weeks, column ``gestational_age``) scales the whole brain and thins the
external CSF; two synthetic sites (column ``centre``) differ in noise and bias field strength. A
third, ``site_C``, is a new centre no generated training set has (``site="site_C"`` renders every
case there): thick slices, more noise, a stronger bias field and a flatter grey/white contrast.
With the same seed the cases keep their anatomy and labels; only the acquisition changes.
Minority conditions are rare in training and well represented in the test split (default 80/12/8
percent in training, a third each in test): the hidden stratification that DRO targets.

Example::

    cases = generate_fetal_cohort(n_train=8, n_test=6, size=32, seed=0)
    make_fetal_dataset(DatasetTarget(990, "SyntheticFetal"),
                       CohortSpec(n_train=40, n_test=30, size=32, seed=0))  # needs $nnUNet_raw
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
from scipy import ndimage

from nnunet_dro.data.feta import FETA_LABELS
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

CONDITIONS = ("control", "spina_bifida", "other")
DEFAULT_TRAIN_FRACTIONS = {"control": 0.80, "spina_bifida": 0.12, "other": 0.08}
DEFAULT_TEST_FRACTIONS = {"control": 1 / 3, "spina_bifida": 1 / 3, "other": 1 / 3}
# Synthetic acquisition sites: (share of cases, noise sd, bias field strength). site_C is never
# drawn: only ``site="site_C"`` renders a case there (a domain-shift test set).
SITES = {"site_A": (0.7, 0.025, 0.12), "site_B": (0.3, 0.045, 0.28), "site_C": (0.0, 0.055, 0.32)}
NEW_CENTRE = "site_C"
#: site_C's acquisition beyond noise and bias: through-plane blur (Gaussian sd in voxels along the
#: first axis, as thick slices give) and how much of the grey/white contrast is left.
NEW_CENTRE_SLICE_BLUR = 1.2
NEW_CENTRE_CONTRAST = 0.6
FIELD_OF_VIEW_MM = 110.0  # a 35-week fetal brain is about 100 mm long

EXT_CSF, GM, WM, VENTRICLES, CEREBELLUM, DEEP_GM, BRAINSTEM = 1, 2, 3, 4, 5, 6, 7
# Mean T2-like intensity per label (CSF bright, grey matter dark, unmyelinated WM in between).
T2_MEANS = {0: 0.0, EXT_CSF: 1.0, GM: 0.36, WM: 0.62, VENTRICLES: 0.95, CEREBELLUM: 0.42,
            DEEP_GM: 0.40, BRAINSTEM: 0.46}
# What a faint cerebellum drifts towards: the brainstem / white matter grey level.
FAINT_TARGET = 0.56


@dataclass(frozen=True)
class FetalAnatomy:
    """The drawn parameters of one brain (lengths in normalised units before GA scaling)."""

    condition: str
    gestational_age: float
    scale: float                      # whole-brain scale from gestational age
    external_csf: float               # thickness of the external CSF as a fraction of the skull
    lemon: float                      # frontal narrowing of the skull (spina bifida)
    ventricles: tuple[float, float]   # right / left lateral ventricle enlargement
    cerebellum_size: float
    cerebellum_flatten: float
    cerebellum_shift: tuple[float, float]  # (z, y): negative z is down, negative y is forward
    cerebellum_contrast: float        # 1 normal, 0 invisible against its surroundings
    hemisphere_spread: float          # extra lateral distance between cerebellar hemispheres
    vermis: float                     # vermis size factor (Dandy-Walker: hypoplastic)
    posterior_fossa: float            # posterior fossa size factor
    fossa_cyst: float                 # radius of a posterior fossa cyst (0: none)
    wm_cyst: tuple[float, float, float, float] | None  # (z, y, x, radius) or None


def draw_anatomy(rng: np.random.Generator, condition: str) -> FetalAnatomy:
    """Draw the anatomy of one case of ``condition``."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}")
    age = float(rng.uniform(20.0, 33.0 if condition == "spina_bifida" else 35.0))
    maturity = (age - 20.0) / 15.0
    base = dict(condition=condition, gestational_age=round(age, 1),
                scale=0.80 + 0.20 * maturity,
                external_csf=(0.09 + 0.05 * (1.0 - maturity)) * rng.uniform(0.85, 1.15),
                lemon=0.0, ventricles=tuple(rng.uniform(0.9, 1.1, 2) * (1.15 - 0.15 * maturity)),
                cerebellum_size=rng.uniform(0.92, 1.08), cerebellum_flatten=1.0,
                cerebellum_shift=(rng.uniform(-0.02, 0.02), rng.uniform(-0.02, 0.02)),
                cerebellum_contrast=1.0, hemisphere_spread=0.0, vermis=1.0,
                posterior_fossa=rng.uniform(0.95, 1.05), fossa_cyst=0.0, wm_cyst=None)
    if condition == "spina_bifida":
        enlarged = rng.uniform(1.5, 2.3) if rng.random() < 0.85 else rng.uniform(1.0, 1.2)
        base.update(external_csf=base["external_csf"] * 0.6, lemon=rng.uniform(0.08, 0.15),
                    ventricles=(enlarged * rng.uniform(0.95, 1.05), enlarged),
                    cerebellum_size=rng.uniform(0.60, 0.80),
                    cerebellum_flatten=rng.uniform(0.6, 0.8),
                    cerebellum_shift=(-rng.uniform(0.08, 0.16), -rng.uniform(0.04, 0.09)),
                    cerebellum_contrast=rng.uniform(0.15, 0.55),
                    # small posterior fossa: little CSF left around the cerebellum
                    posterior_fossa=rng.uniform(0.55, 0.65))
    elif condition == "other":
        big_side = int(rng.integers(2))
        ventricles = [rng.uniform(1.0, 1.3), rng.uniform(1.0, 1.3)]
        ventricles[big_side] = rng.uniform(1.6, 2.4)
        base.update(ventricles=tuple(ventricles), fossa_cyst=rng.uniform(0.14, 0.20),
                    cerebellum_shift=(rng.uniform(0.03, 0.07), rng.uniform(-0.02, 0.02)),
                    hemisphere_spread=rng.uniform(0.05, 0.09), vermis=rng.uniform(0.2, 0.5),
                    cerebellum_size=rng.uniform(0.8, 0.95), cerebellum_contrast=0.9,
                    posterior_fossa=rng.uniform(1.15, 1.3))
        if rng.random() < 0.7:
            side = 1.0 if rng.random() < 0.5 else -1.0
            base["wm_cyst"] = (rng.uniform(0.12, 0.30), rng.uniform(-0.35, 0.25),
                               side * rng.uniform(0.30, 0.40), rng.uniform(0.08, 0.13))
    return FetalAnatomy(**base)


def render_fetal_case(anatomy: FetalAnatomy, size: int, rng: np.random.Generator,
                      site: str = "site_A") -> tuple[np.ndarray, np.ndarray]:
    """Draw the label map and T2-like image (float32) of ``anatomy`` on a ``size``^3 grid."""
    a = anatomy
    z, y, x = (c / a.scale for c in random_warp(rng, grid(size), amplitude=0.035,
                                                 max_rotation_deg=8.0, max_shift=0.04))
    label = np.zeros((size,) * 3, dtype=np.uint8)

    # Skull interior: everything inside is at least external CSF. Lemon sign narrows the front.
    lemon = 1.0 - a.lemon * np.clip(-y, 0.0, None)
    skull_radii = (0.76, 0.92, 0.78)
    skull = ellipsoid((z, y, x / lemon), (0.02, 0.0, 0.0), skull_radii) < 1.0
    label[skull] = EXT_CSF

    brain_radii = tuple(r * (1.0 - a.external_csf) for r in skull_radii)
    brain_distance = np.sqrt(ellipsoid((z, y, x / lemon), (0.02, 0.0, 0.0), brain_radii))
    fossa = ellipsoid((z, y, x), (-0.40, 0.36, 0.0),
                      tuple(r * a.posterior_fossa for r in (0.28, 0.34, 0.44)))
    brainstem = skull & (ellipsoid((z, y, x), (-0.45, 0.10, 0.0), (0.42, 0.12, 0.12)) < 1.0)
    cerebrum = (brain_distance < 1.0) & (fossa > 1.15) & ~brainstem
    # Cortical ribbon at least ~1.6 voxels thick whatever the grid size.
    ribbon = max(0.10, 1.6 / (size / 2.0 * a.scale * min(brain_radii)))
    label[cerebrum] = WM
    label[cerebrum & (brain_distance > 1.0 - ribbon)] = GM

    for side in (-1.0, 1.0):
        label[cerebrum & (ellipsoid((z, y, x), (-0.06, 0.05, side * 0.13),
                                    (0.11, 0.17, 0.10)) < 1.0)] = DEEP_GM
    label[brainstem] = BRAINSTEM
    label[skull & (fossa < 1.0) & ~brainstem] = EXT_CSF  # cisterna magna around the cerebellum

    dz, dy = a.cerebellum_shift
    cs = a.cerebellum_size
    cerebellum = np.zeros_like(skull)
    for side in (-1.0, 1.0):
        cerebellum |= ellipsoid((z, y, x), (-0.42 + dz, 0.40 + dy,
                                            side * (0.16 + a.hemisphere_spread) * cs),
                                (0.20 * cs * a.cerebellum_flatten, 0.23 * cs, 0.22 * cs)) < 1.0
    cerebellum |= ellipsoid((z, y, x), (-0.40 + dz, 0.44 + dy, 0.0),
                            (0.17 * cs * a.cerebellum_flatten * a.vermis, 0.19 * cs * a.vermis,
                             0.09 * cs)) < 1.0
    label[skull & cerebellum & ~brainstem] = CEREBELLUM

    # Intra-axial CSF: lateral ventricles (bent like horns), third ventricle, cavum, fourth.
    inner = brain_distance < 1.0 - ribbon
    bent_z = z - 0.25 * y ** 2
    for side, enlargement in zip((-1.0, 1.0), a.ventricles):
        lateral = ellipsoid((bent_z, y, x), (0.14, 0.02, side * 0.16),
                            (0.11 * enlargement, 0.42 * (1 + 0.2 * (enlargement - 1)),
                             0.08 * enlargement))
        label[inner & (lateral < 1.0)] = VENTRICLES
    label[inner & (ellipsoid((z, y, x), (-0.06, 0.05, 0.0), (0.10, 0.14, 0.025)) < 1.0)] = VENTRICLES
    label[inner & (ellipsoid((z, y, x), (0.15, -0.22, 0.0), (0.07, 0.10, 0.03)) < 1.0)] = VENTRICLES
    fourth = 0.5 if a.condition == "spina_bifida" else 1.0
    label[skull & (ellipsoid((z, y, x), (-0.40 + dz / 2, 0.24 + dy / 2, 0.0),
                             (0.06 * fourth, 0.05 * fourth, 0.06 * fourth)) < 1.0)] = VENTRICLES
    if a.fossa_cyst > 0:
        cyst = ellipsoid((z, y, x), (-0.44, 0.46, 0.0),
                         (a.fossa_cyst, 1.1 * a.fossa_cyst, 1.2 * a.fossa_cyst)) < 1.0
        label[skull & cyst & ~brainstem] = VENTRICLES
    if a.wm_cyst is not None:
        cz, cy, cx, radius = a.wm_cyst
        label[inner & (ellipsoid((z, y, x), (cz, cy, cx), (radius,) * 3) < 1.0)] = VENTRICLES

    return label, _t2_image(label, a, rng, site)


def _t2_image(label: np.ndarray, anatomy: FetalAnatomy, rng: np.random.Generator,
              site: str) -> np.ndarray:
    means = {k: v * (1.0 + rng.normal(0.0, 0.04)) if k else 0.0 for k, v in T2_MEANS.items()}
    c = anatomy.cerebellum_contrast
    means[CEREBELLUM] = c * means[CEREBELLUM] + (1.0 - c) * FAINT_TARGET
    lookup = np.array([means[k] for k in range(len(T2_MEANS))], dtype=np.float32)
    if site == NEW_CENTRE:  # another sequence: grey and white matter drawn towards their middle
        middle = (lookup[GM] + lookup[WM]) / 2.0
        for k in (GM, WM, DEEP_GM, CEREBELLUM, BRAINSTEM):
            lookup[k] = middle + NEW_CENTRE_CONTRAST * (lookup[k] - middle)
    image = lookup[label] ** rng.uniform(0.85, 1.2)  # per-case contrast (gamma)
    if site == NEW_CENTRE:  # thick slices (deterministic: the random draws stay those of any site)
        image = ndimage.gaussian_filter1d(image, NEW_CENTRE_SLICE_BLUR, axis=0)
    _, noise_sd, bias = SITES[site]
    return finish_intensity(rng, image, label > 0, noise_sd=noise_sd, bias_strength=bias)


def generate_fetal_cohort(n_train: int = 40, n_test: int = 30, size: int = 32, seed: int = 0,
                          train_fractions: Mapping[str, float] = DEFAULT_TRAIN_FRACTIONS,
                          test_fractions: Mapping[str, float] = DEFAULT_TEST_FRACTIONS,
                          site: str | None = None) -> list[SyntheticCase]:
    """Generate the cases in memory (same arguments -> identical arrays). ``site``: render every
    case at this site (e.g. the new centre ``site_C``) instead of drawing site_A or site_B; the
    anatomy and labels stay those of the same seed without it.

    >>> cases = generate_fetal_cohort(n_train=4, n_test=3, size=24, seed=1)
    >>> [c.split for c in cases].count("test"), cases[0].channels[0].shape
    (3, (24, 24, 24))
    >>> shifted = generate_fetal_cohort(n_train=4, n_test=3, size=24, seed=1, site="site_C")
    >>> bool((shifted[0].label == cases[0].label).all()), shifted[0].groups["centre"]
    (True, 'site_C')
    """
    check_cohort_size(n_train, n_test, size)
    if site is not None and site not in SITES:
        raise ValueError(f"site {site!r}: expected one of {', '.join(SITES)}")
    cases = []
    for index, (split, condition) in enumerate(
            assign_groups(seed, n_train, n_test, train_fractions, test_fractions)):
        rng = case_rng(seed, index)
        drawn = "site_A" if rng.random() < SITES["site_A"][0] else "site_B"  # drawn even when forced
        case_site = drawn if site is None else site
        anatomy = draw_anatomy(rng, condition)
        label, image = render_fetal_case(anatomy, size, rng, case_site)
        cases.append(SyntheticCase(
            case=f"fetal_{index:03d}", split=split, channels=[image], label=label,
            groups={"condition": condition, "gestational_age": anatomy.gestational_age,
                    "centre": case_site}))
    return cases


def make_fetal_dataset(target: DatasetTarget, cohort: CohortSpec = CohortSpec(), site: str | None = None) -> Path:
    """Generate the ``cohort`` and write it to ``target`` (``$nnUNet_raw/DatasetXXX_<name>``); return
    the folder. ``site``: as :func:`generate_fetal_cohort` (the fetal cohort's own, not the spec's:
    the BraTS-like cohort draws its sites as groups)."""
    train_fractions, test_fractions = cohort.fractions(DEFAULT_TRAIN_FRACTIONS, DEFAULT_TEST_FRACTIONS)
    cases = generate_fetal_cohort(cohort.n_train, cohort.n_test, cohort.size, cohort.seed, train_fractions,
                                  test_fractions, site)
    return write_cohort(cases, target, channel_names={0: "T2"}, labels=FETA_LABELS,
                        spacing_mm=FIELD_OF_VIEW_MM / cohort.size,
                        description=f"synthetic fetal-brain-like cohort (seed {cohort.seed}, "
                                    f"{cohort.n_train} train / {cohort.n_test} test, {cohort.size}^3"
                                    + (f", every case at {site}" if site else "") + ")")
