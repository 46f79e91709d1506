"""Building blocks shared by the synthetic cohorts: grids, smooth random fields, shapes, groups.

Everything is drawn from ``numpy.random.Generator`` objects derived from one seed, case by case
(``case_rng(seed, index)``), so a cohort is reproducible and one case does not depend on how many
others were generated before it.

Coordinates are normalised: the volume spans (-1, 1) along each axis, arrays are indexed
``[z, y, x]`` (SimpleITK's numpy order) with z inferior -> superior, y anterior -> posterior and
x right -> left.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import SimpleITK as sitk
from scipy import ndimage

from nnunet_dro.data.raw_dataset import TEST, TRAIN, DatasetTarget
from nnunet_dro.errors import UserError


@dataclass
class SyntheticCase:
    """One generated case: channels (float32 arrays), a label array and its group values."""

    case: str
    split: str
    channels: list[np.ndarray]
    label: np.ndarray
    groups: dict[str, object] = field(default_factory=dict)


def case_rng(seed: int, index: int) -> np.random.Generator:
    """The random generator of case ``index`` of the cohort drawn with ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(index)]))


def grid(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Voxel-centre coordinates (z, y, x) in (-1, 1), each of shape (size, size, size)."""
    axis = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0
    return np.meshgrid(axis, axis, axis, indexing="ij")


def smooth_field(rng: np.random.Generator, size: int, amplitude: float,
                 control_points: int = 4) -> np.ndarray:
    """A smooth random field with max |value| = amplitude: random low-frequency cosine series.

    ``control_points`` cosine frequencies per axis (0 .. control_points-1 half-waves across the
    volume); the separable basis makes this a cheap tensor contraction even for large grids.
    """
    t = (np.arange(size, dtype=np.float64) + 0.5) / size
    basis = np.cos(np.pi * np.outer(t, np.arange(control_points)))  # (size, K)
    frequency = np.arange(control_points)
    # Damp higher frequencies so the field is dominated by broad variations.
    damping = 1.0 / (1.0 + np.add.outer(np.add.outer(frequency, frequency), frequency))
    coefficients = rng.normal(size=(control_points,) * 3) * damping
    coefficients[0, 0, 0] = 0.0  # zero-mean-ish: no constant offset
    fine = np.einsum("ia,jb,kc,abc->ijk", basis, basis, basis, coefficients, optimize=True)
    peak = float(np.abs(fine).max()) or 1.0
    return (fine / peak * amplitude).astype(np.float32)


def random_warp(rng: np.random.Generator, coords: Sequence[np.ndarray], amplitude: float,
                max_rotation_deg: float, max_shift: float) -> tuple[np.ndarray, ...]:
    """Coordinates after a small random rotation, shift and smooth deformation.

    Shapes evaluated at the returned coordinates look rotated, shifted and gently deformed, so no
    two cases share a template exactly.
    """
    size = coords[0].shape[0]
    angles = np.deg2rad(rng.uniform(-max_rotation_deg, max_rotation_deg, size=3))
    rotation = _rotation_matrix(*angles)
    shift = rng.uniform(-max_shift, max_shift, size=3)
    stacked = np.stack([c - s for c, s in zip(coords, shift)], axis=0).reshape(3, -1)
    rotated = (rotation @ stacked).reshape((3,) + coords[0].shape)
    return tuple(rotated[i] + smooth_field(rng, size, amplitude) for i in range(3))


def _rotation_matrix(a: float, b: float, c: float) -> np.ndarray:
    ca, sa, cb, sb, cc, sc = np.cos(a), np.sin(a), np.cos(b), np.sin(b), np.cos(c), np.sin(c)
    rx = np.array([[1, 0, 0], [0, ca, -sa], [0, sa, ca]])
    ry = np.array([[cb, 0, sb], [0, 1, 0], [-sb, 0, cb]])
    rz = np.array([[cc, -sc, 0], [sc, cc, 0], [0, 0, 1]])
    return (rz @ ry @ rx).astype(np.float32)


def ellipsoid(coords: Sequence[np.ndarray], centre: Sequence[float],
              radii: Sequence[float]) -> np.ndarray:
    """Normalised ellipsoid distance: < 1 inside, 1 on the surface (coords and centre in z, y, x)."""
    return sum(((c - m) / max(r, 1e-6)) ** 2 for c, m, r in zip(coords, centre, radii))


def group_counts(total: int, fractions: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` cases over groups by ``fractions`` (largest remainder rounding).

    Every group with a positive fraction gets at least one case when ``total`` allows, so a rare
    group is rare but present (DRO can only up-weight what it has seen).

    >>> group_counts(40, {"control": 0.8, "spina_bifida": 0.12, "other": 0.08})
    {'control': 32, 'spina_bifida': 5, 'other': 3}
    >>> group_counts(3, {"a": 0.98, "b": 0.01, "c": 0.01})
    {'a': 1, 'b': 1, 'c': 1}
    """
    names = [n for n, f in fractions.items() if f > 0]
    weights = np.array([fractions[n] for n in names], dtype=float)
    if total < 0 or not names:
        raise UserError("need a non-negative case count and at least one group with a positive "
                        "fraction")
    weights = weights / weights.sum()
    raw = weights * total
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    if total >= len(names):
        while (counts == 0).any():
            counts[int(np.argmax(counts))] -= 1
            counts[int(np.argmax(counts == 0))] += 1
    return {n: int(c) for n, c in zip(names, counts)}


def parse_fractions(text: str, allowed: Sequence[str]) -> dict[str, float]:
    """``"control=0.8,spina_bifida=0.12,other=0.08"`` -> dict; UserError on unknown names.

    >>> parse_fractions("a=3,b=1", ["a", "b"])
    {'a': 0.75, 'b': 0.25}
    """
    fractions: dict[str, float] = {name: 0.0 for name in allowed}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in fractions:
            raise UserError(f"unknown group {name!r} in {text!r}; known: {', '.join(allowed)}")
        try:
            fractions[name] = float(value)
        except ValueError:
            raise UserError(f"group fraction {part!r} is not NAME=NUMBER") from None
        if not np.isfinite(fractions[name]) or fractions[name] < 0:
            raise UserError(f"group fraction {part!r} must be a finite number >= 0")
    total = sum(fractions.values())
    if total <= 0:
        raise UserError(f"group fractions {text!r} sum to zero")
    return {name: value / total for name, value in fractions.items()}


def assign_groups(seed: int, n_train: int, n_test: int, train_fractions: Mapping[str, float],
                  test_fractions: Mapping[str, float]) -> list[tuple[str, str]]:
    """(split, group) for every case index, groups shuffled so case IDs reveal nothing."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2**31 - 1]))
    plan = []
    for split, total, fractions in ((TRAIN, n_train, train_fractions),
                                    (TEST, n_test, test_fractions)):
        groups = [g for g, c in group_counts(total, fractions).items() for _ in range(c)]
        plan += [(split, groups[i]) for i in rng.permutation(len(groups))]
    return plan


def check_cohort_size(n_train: int, n_test: int, size: int) -> None:
    """UserError for case counts or a grid size the generators cannot honour."""
    if n_train < 1 or n_test < 0:
        raise UserError(f"need --n-train >= 1 and --n-test >= 0 (got {n_train}, {n_test})")
    if not 16 <= size <= 256:
        raise UserError(f"--size {size} is outside 16..256 voxels")


@dataclass(frozen=True)
class CohortSpec:
    """What a synthetic cohort draws (``make-synthetic``'s ``--n-train``, ``--n-test``, ``--size``,
    ``--seed``, ``--train-mix``, ``--test-mix``): case counts, voxels per side, the seed, and the
    group shares of each split (group -> share, normalised by the generator; None: the kind's
    defaults, e.g. ``DEFAULT_TRAIN_FRACTIONS`` of :mod:`~nnunet_dro.data.synthetic_fetal`).
    Counts or a size the generators cannot honour, or a negative seed, are a one-line UserError.

    >>> CohortSpec(n_train=8, n_test=6, size=24).size
    24
    >>> CohortSpec(n_train=0)
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: need --n-train >= 1 and --n-test >= 0 (got 0, 30)
    """

    n_train: int = 40
    n_test: int = 30
    size: int = 32
    seed: int = 0
    train_fractions: Mapping[str, float] | None = None
    test_fractions: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        check_cohort_size(self.n_train, self.n_test, self.size)
        if self.seed < 0:
            raise UserError(f"--seed {self.seed} must be >= 0")

    def fractions(self, train_default: Mapping[str, float],
                  test_default: Mapping[str, float]) -> tuple[Mapping[str, float], Mapping[str, float]]:
        """(train, test) group shares: this spec's, or the kind's defaults where it has none."""
        return (train_default if self.train_fractions is None else self.train_fractions,
                test_default if self.test_fractions is None else self.test_fractions)


def bias_field(rng: np.random.Generator, size: int, strength: float) -> np.ndarray:
    """A smooth multiplicative intensity inhomogeneity, exp(field) with |field| <= strength."""
    return np.exp(smooth_field(rng, size, strength, control_points=3))


def finish_intensity(rng: np.random.Generator, mean_image: np.ndarray, foreground: np.ndarray,
                     noise_sd: float, bias_strength: float, blur_voxels: float = 0.6) -> np.ndarray:
    """Partial volume (Gaussian blur), bias field, Rician-like noise, arbitrary scanner scale."""
    image = ndimage.gaussian_filter(mean_image, blur_voxels) if blur_voxels > 0 else mean_image
    image = image * bias_field(rng, mean_image.shape[0], bias_strength)
    real = image + rng.normal(0.0, noise_sd, image.shape)
    imaginary = rng.normal(0.0, noise_sd, image.shape)
    image = np.sqrt(real ** 2 + imaginary ** 2)
    # Background outside the (slightly dilated) head stays dark, as in masked reconstructions.
    support = ndimage.binary_dilation(foreground, iterations=1)
    image = np.where(support, image, image * 0.15)
    return (image * rng.uniform(300.0, 1200.0)).astype(np.float32)


def write_cohort(cases: Sequence[SyntheticCase], target: DatasetTarget, channel_names: Mapping[int, str],
                 labels: Mapping[str, object], spacing_mm: float, description: str,
                 regions_class_order: Sequence[int] | None = None) -> Path:
    """Write generated cases to ``target`` as an nnU-Net raw dataset with ``subgroups.tsv``; return its folder."""
    rows = [{"case": c.case, **c.groups, "split": c.split} for c in cases]
    with target.writer(len(channel_names)) as writer:
        for number, case in enumerate(cases, start=1):
            if number == 1 or number % 10 == 0 or number == len(cases):
                target.progress(f"writing case {number}/{len(cases)}")
            for channel, array in enumerate(case.channels):
                writer.write_image(case.case, channel, _to_image(array, spacing_mm), case.split)
            label = _to_image(case.label.astype(np.uint8), spacing_mm)
            writer.write_label(case.case, label, case.split)
        writer.finish(channel_names=channel_names, labels=labels, subgroups=pd.DataFrame(rows),
                      regions_class_order=regions_class_order, dataset_name=target.name,
                      description=description, license="CC0 (synthetic data)",
                      reference="generated by nnunet_dro make-synthetic")
    return writer.target


def _to_image(array: np.ndarray, spacing_mm: float) -> sitk.Image:
    image = sitk.GetImageFromArray(array)
    image.SetSpacing((spacing_mm,) * 3)
    # Centre the volume on the scanner origin, like a reconstructed and centred fetal brain.
    image.SetOrigin(tuple(-0.5 * spacing_mm * (n - 1) for n in image.GetSize()))
    return image
