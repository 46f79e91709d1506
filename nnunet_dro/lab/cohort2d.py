"""The converged regime's 2D cohort (issue 78): one parasagittal plane of each synthetic fetal volume.

Why 2D. At 125 training cases of 24^3 voxels nnU-Net plans a batch of 6 (its cap of 5 % of the
dataset's voxels per batch; 2 at 40 cases), so a 3D epoch costs about 3 times the decision regime's
and a training to convergence several hours of a core; nnU-Net's ``2d`` configuration of the same
volumes is no cheaper (a batch of 150 slices). One plane per case, rendered at 64^2, trains about
ten times faster per epoch (measured December 6, 2026: 2.0-2.7 s against 20-27 s per 25-iteration
epoch on one loaded core), so the decision's many seeds can run to convergence.

Why this plane. The cases are the 3D generator's (same seed: same anatomy, groups, sites and
noise), cut at ``x = PLANE_X`` of the half-width, right of the midline: the plane crosses a lateral
ventricle, a cerebellar hemisphere and the posterior fossa, so both kinds of hidden stratification
stay: the "other" group's enlarged intra-axial CSF (its posterior fossa cyst and asymmetric
ventricles: under-fitted because rare) and the spina bifida group's small, faint cerebellum (hard
because faint). At 64^2 and seed 40 every structure but the brainstem is in almost every case
(the brainstem, a midline structure, is in about 40 % of the controls); no FeTA region the decision
scores is missing in more than 5 of 102 controls.

The plane is written as a one-slice volume (1 x 64 x 64, the singleton first), which nnU-Net plans
as a 2D dataset and ``nnunet_dro evaluate`` scores as one slice. The benchmark writes it with this
module's command line, ``make-synthetic``'s fetal options and ``--plane``::

    python -m nnunet_dro.lab.cohort2d --id 601 -n Planes --n-train 125 --n-test 30 --size 64 --seed 40
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.synthetic_common import CohortSpec, SyntheticCase, write_cohort
from nnunet_dro.data.synthetic_fetal import (
    DEFAULT_TEST_FRACTIONS,
    DEFAULT_TRAIN_FRACTIONS,
    FETA_LABELS,
    FIELD_OF_VIEW_MM,
    generate_fetal_cohort,
)
from nnunet_dro.errors import UserError

#: the plane's position right of the midline, as a fraction of the half-width (the grid runs -1..1)
PLANE_X = 0.11
#: pixels per side of the rendered plane
PLANE_SIZE = 64


def plane_index(size: int, x: float = PLANE_X) -> int:
    """The voxel column whose centre is nearest ``x`` on the generator's grid (centres at
    ``(i + 0.5) / size * 2 - 1``).

    >>> plane_index(64), plane_index(64, 0.0), plane_index(24, 0.11)
    (35, 32, 13)
    """
    return int(np.clip(round((x + 1.0) / 2.0 * size - 0.5), 0, size - 1))


def plane_cases(cases: Sequence[SyntheticCase], x: float = PLANE_X) -> list[SyntheticCase]:
    """Each case cut at ``x`` (a sagittal plane of the (z, y, x) volume) as a one-slice volume of
    shape (1, z, y); groups, split and names kept.

    >>> from nnunet_dro.data.synthetic_fetal import generate_fetal_cohort
    >>> cut = plane_cases(generate_fetal_cohort(n_train=3, n_test=3, size=24, seed=1))
    >>> cut[0].label.shape, cut[0].channels[0].shape, cut[0].case
    ((1, 24, 24), (1, 24, 24), 'fetal_000')
    """
    if not cases:
        return []
    index = plane_index(cases[0].label.shape[2], x)

    def cut(array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array[:, :, index][None])

    return [dataclasses.replace(case, channels=[cut(channel) for channel in case.channels], label=cut(case.label))
            for case in cases]


def make_plane_dataset(target: DatasetTarget, cohort: CohortSpec, site: str | None = None,
                       x: float = PLANE_X) -> Path:
    """The fetal ``cohort`` of :func:`~nnunet_dro.data.synthetic_fetal.make_fetal_dataset` (same
    seed: same cases), each cut at ``x``, written to ``target``; return the folder."""
    train_fractions, test_fractions = cohort.fractions(DEFAULT_TRAIN_FRACTIONS, DEFAULT_TEST_FRACTIONS)
    volumes = generate_fetal_cohort(cohort.n_train, cohort.n_test, cohort.size, cohort.seed, train_fractions,
                                    test_fractions, site)
    return write_cohort(plane_cases(volumes, x), target, channel_names={0: "T2"}, labels=FETA_LABELS,
                        spacing_mm=FIELD_OF_VIEW_MM / cohort.size,
                        description=f"synthetic fetal-brain-like planes at x = {x:g} (seed {cohort.seed}, "
                                    f"{cohort.n_train} train / {cohort.n_test} test, {cohort.size}^2"
                                    + (f", every case at {site}" if site else "") + ")")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nnunet_dro.lab.cohort2d", description=__doc__.split("\n\n")[0])
    parser.add_argument("--id", type=int, required=True, help="nnU-Net dataset ID")
    parser.add_argument("-n", dest="name", default="SyntheticFetalPlanes", help="dataset name")
    parser.add_argument("--n-train", type=int, default=40)
    parser.add_argument("--n-test", type=int, default=30)
    parser.add_argument("--size", type=int, default=PLANE_SIZE, help=f"pixels per side. Default: {PLANE_SIZE}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--site", choices=("site_A", "site_B", "site_C"), default=None)
    parser.add_argument("--plane", type=float, default=PLANE_X, help=f"x of the plane in (-1, 1). Default: {PLANE_X}")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        if not -1 < args.plane < 1:
            raise UserError(f"--plane {args.plane}: must lie strictly between -1 and 1 (the grid's half-widths)")
        folder = make_plane_dataset(DatasetTarget(args.id, args.name, args.overwrite),
                                    CohortSpec(args.n_train, args.n_test, args.size, args.seed), args.site, args.plane)
    except UserError as error:
        print(f"cohort2d: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {folder} ({args.n_train} train, {args.n_test} test, planes of {args.size}^2 at x = {args.plane:g}, "
          f"seed {args.seed}{', ' + args.site if args.site else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
