"""NSD and topology errors (issue 66, item 1): checked against independent computations on
hand-built masks (a torus, a hollow sphere, two blobs, empty masks) and a brute-force
surface-distance NSD, then through ``evaluate`` on real NIfTI files."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from skimage.measure import euler_number

from eval_testdata import write_label_map
from nnunet_dro.evaluation import evaluate
from nnunet_dro.evaluation.metrics import nsd_percent, topology, topology_errors


def ball(shape, centre, radius, spacing=(1.0, 1.0, 1.0)) -> np.ndarray:
    grids = np.meshgrid(*[np.arange(n) * s for n, s in zip(shape, spacing)], indexing="ij")
    return sum((g - c) ** 2 for g, c in zip(grids, centre)) <= radius ** 2


def torus(n=24, major=7.0, minor=2.6) -> np.ndarray:
    z, y, x = np.mgrid[:n, :n, :n] - (n - 1) / 2
    return (np.sqrt(y ** 2 + x ** 2) - major) ** 2 + z ** 2 <= minor ** 2


def hollow_sphere(n=22) -> np.ndarray:
    c = (n - 1) / 2
    return ball((n,) * 3, (c,) * 3, 9) & ~ball((n,) * 3, (c,) * 3, 5)


def two_blobs() -> np.ndarray:
    mask = np.zeros((16, 16, 16), bool)
    mask[1:5, 1:5, 1:5] = True
    mask[8:14, 9:15, 7:12] = True
    return mask


def cubical_euler(mask: np.ndarray) -> int:
    """Euler characteristic V - E + F - C of the union of closed unit cubes (26-connected
    foreground), counted cell by cell: a vertex, edge or face belongs to the complex when any
    voxel around it is foreground. Independent of scikit-image."""
    m = np.pad(mask.astype(bool), 1)
    counts = []
    for dims in range(4):  # cells of dimension 0..3 as the voxels sharing them
        total = 0
        for axes in _combinations(3, dims):
            # a cell extending along `axes` is shared by the 2**(3-dims) voxels around it in the other axes
            other = [a for a in range(3) if a not in axes]
            shared = np.zeros(tuple(s - 1 if a in other else s for a, s in enumerate(m.shape)), bool)
            for offsets in np.ndindex(*(2,) * len(other)):
                index = [slice(None)] * 3
                for a, o in zip(other, offsets):
                    index[a] = slice(o, m.shape[a] - 1 + o)
                shared |= m[tuple(index)]
            total += int(shared.sum())
        counts.append(total)
    v, e, f, c = counts
    return v - e + f - c


def _combinations(n, k):
    from itertools import combinations
    return list(combinations(range(n), k))


@pytest.mark.parametrize("name, mask, expected", [
    ("torus", torus(), (0, 1, 1, 0)),
    ("hollow sphere", hollow_sphere(), (2, 1, 0, 1)),
    ("two blobs", two_blobs(), (2, 2, 0, 0)),
    ("empty", np.zeros((8, 8, 8), bool), (0, 0, 0, 0)),
    ("solid ball", ball((12, 12, 12), (6, 6, 6), 4), (1, 1, 0, 0)),
    ("torus touching the border", torus()[:, 2:-2, 2:-2], (0, 1, 1, 0)),
])
def test_topology_of_hand_built_masks(name, mask, expected):
    assert topology(mask) == expected
    assert cubical_euler(mask) == expected[0]
    assert euler_number(np.pad(mask, 1), connectivity=3) == expected[0]  # scikit-image's count


def test_euler_matches_scikit_image_and_the_cubical_complex_count_on_random_masks():
    rng = np.random.default_rng(3)
    for _ in range(20):
        mask = rng.random((7, 8, 6)) < rng.uniform(0.2, 0.7)
        chi, b0, b1, b2 = topology(mask)
        assert chi == cubical_euler(mask) == euler_number(np.pad(mask, 1), connectivity=3)
        assert chi == b0 - b1 + b2 and min(b0, b1, b2) >= 0
        square = rng.random((9, 8)) < 0.5
        assert topology(square)[0] == euler_number(np.pad(square, 1), connectivity=2)


def test_2d_ring_and_single_slice_volume():
    ring = np.ones((5, 5), bool)
    ring[1:4, 1:4] = False
    assert topology(ring) == (0, 1, 1, 0)
    assert topology(ring[None]) == (0, 1, 1, 0)  # a 2D case stored as one slice: the hole is a tunnel


def test_topology_errors_are_absolute_differences():
    assert topology_errors(topology(torus()), topology(two_blobs())) == {"euler": 2.0, "b0": 1.0, "b1": 1.0,
                                                                         "b2": 0.0}
    assert topology_errors(topology(hollow_sphere()), (0, 0, 0, 0)) == {"euler": 2.0, "b0": 1.0, "b1": 0.0,
                                                                        "b2": 1.0}


def brute_force_nsd(a: np.ndarray, b: np.ndarray, spacing, tolerance: float) -> float:
    """Surface voxels (a 6-neighbour outside the mask or the image) by explicit shifts, all
    pairwise Euclidean distances in mm, counted."""
    def surface_points(mask):
        padded = np.pad(mask, 1)
        inner = np.ones_like(mask)
        for axis in range(3):
            for shift in (-1, 1):
                inner &= np.roll(padded, shift, axis=axis)[1:-1, 1:-1, 1:-1]
        return np.argwhere(mask & ~inner) * np.asarray(spacing)

    pa, pb = surface_points(a), surface_points(b)
    d = cdist(pa, pb)
    within = (d.min(axis=1) <= tolerance + 1e-6).sum() + (d.min(axis=0) <= tolerance + 1e-6).sum()
    return 100.0 * within / (len(pa) + len(pb))


@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (2.0, 0.7, 0.5)])
@pytest.mark.parametrize("tolerance", [0.0, 1.0, 2.5])
def test_nsd_equals_brute_force_surface_distances(spacing, tolerance):
    rng = np.random.default_rng(int(10 * tolerance) + len(str(spacing)))
    for _ in range(3):
        a = ball((14, 15, 16), rng.uniform(4, 9, 3) * spacing, rng.uniform(3, 6))
        b = ball((14, 15, 16), rng.uniform(4, 9, 3) * spacing, rng.uniform(3, 6)) | (rng.random((14, 15, 16)) < 0.02)
        if not a.any() or not b.any():
            continue
        assert nsd_percent(a, b, spacing, tolerance) == pytest.approx(brute_force_nsd(a, b, spacing, tolerance))


def test_nsd_identical_masks_is_100_and_far_masks_0():
    a = ball((20, 20, 20), (5, 5, 5), 3)
    b = ball((20, 20, 20), (15, 15, 15), 3)
    assert nsd_percent(a, a, (1, 1, 1), 0.0) == 100.0
    assert nsd_percent(a, b, (1, 1, 1), 2.0) == 0.0


def _scores(result, metric, case, region="1", method="A"):
    pc = result.per_case
    return pc[(pc.metric == metric) & (pc.case == case) & (pc.region == region) & (pc.method == method)]["value"].item()


@pytest.fixture()
def topology_cohort(tmp_path):
    """Reference and prediction pairs built by hand, label 1 only unless stated."""
    n = 24
    solid_torus = torus(n)
    filled = solid_torus | (np.abs(np.mgrid[:n, :n, :n][0] - (n - 1) / 2) <= 2.6) & (
        np.sqrt(((np.mgrid[:n, :n, :n][1:] - (n - 1) / 2) ** 2).sum(0)) <= 8)  # the hole closed: a disc
    shell = np.zeros((n,) * 3, bool)
    shell[1:-1, 1:-1, 1:-1] = hollow_sphere(n - 2)
    blobs = np.zeros((n,) * 3, bool)
    blobs[:16, :16, :16] = two_blobs()
    empty = np.zeros((n,) * 3, np.uint8)
    pairs = {"case_torus": (solid_torus, filled), "case_shell": (shell, ball((n,) * 3, (11.5,) * 3, 9)),
             "case_blobs": (blobs, blobs), "case_pred_empty": (blobs, empty), "case_both_empty": (empty, empty)}
    for case, (ref, pred) in pairs.items():
        ref_map = ref.astype(np.uint8)
        ref_map[0, 0, 0] = 2 if case == "case_both_empty" else ref_map[0, 0, 0]  # label 2 keeps the case non-empty
        write_label_map(tmp_path / "ref" / f"{case}.nii.gz", ref_map, spacing=(1.0, 1.0, 1.0))
        pred_map = np.asarray(pred).astype(np.uint8)
        pred_map[0, 0, 0] = ref_map[0, 0, 0] if case == "case_both_empty" else pred_map[0, 0, 0]
        write_label_map(tmp_path / "pred" / f"{case}.nii.gz", pred_map, spacing=(1.0, 1.0, 1.0))
    return tmp_path, pairs


@pytest.mark.parametrize("empty", ["one", "nan"])
def test_topology_and_nsd_through_evaluate(topology_cohort, empty):
    root, pairs = topology_cohort
    result = evaluate(str(root / "ref"), {"A": str(root / "pred")}, None, regions="one=1;two=2",
                      metrics=["nsd", "topology"], nsd_tolerance=1.0, empty=empty, num_processes=1,
                      progress=False, strict=False, echo=lambda _: None)
    for case, (ref, pred) in pairs.items():
        if case == "case_both_empty":
            continue
        expected = topology_errors(topology(ref), topology(np.asarray(pred, bool)))
        for metric, value in expected.items():
            assert _scores(result, metric, case, "one") == value, (case, metric)
    assert _scores(result, "b1", "case_torus", "one") == 1.0  # the filled torus lost its tunnel
    assert _scores(result, "b2", "case_shell", "one") == 1.0  # the solid ball has no cavity
    assert _scores(result, "b0", "case_pred_empty", "one") == 2.0  # both blobs missed
    assert _scores(result, "nsd", "case_pred_empty", "one") == 0.0  # one side empty
    assert _scores(result, "nsd", "case_blobs", "one") == 100.0
    ref, pred = pairs["case_shell"]
    assert _scores(result, "nsd", "case_shell", "one") == pytest.approx(brute_force_nsd(ref, pred, (1, 1, 1), 1.0))
    both = [_scores(result, m, "case_both_empty", "one") for m in ("nsd", "euler", "b0")]
    if empty == "one":
        assert both == [100.0, 0.0, 0.0]
    else:
        assert all(np.isnan(both))
    assert result.settings["nsd_tolerance_mm"] == 1.0
    assert result.settings["directions"]["b1"] == "lower is better"


def test_missing_prediction_scores_topology_as_an_empty_prediction(topology_cohort):
    root, pairs = topology_cohort
    (root / "pred" / "case_shell.nii.gz").unlink()
    result = evaluate(str(root / "ref"), {"A": str(root / "pred")}, None, regions="one=1",
                      metrics=["topology", "nsd"], missing="worst", num_processes=1, progress=False,
                      echo=lambda _: None)
    assert [_scores(result, m, "case_shell", "one") for m in ("euler", "b0", "b1", "b2", "nsd")] == \
        [2.0, 1.0, 0.0, 1.0, 0.0]


def test_nsd_default_tolerance_by_preset_and_option_check(tmp_path):
    from nnunet_dro.errors import UserError
    from nnunet_dro.evaluation.api import default_nsd_tolerance
    from nnunet_dro.evaluation.regions import PRESETS, parse_regions

    assert default_nsd_tolerance(PRESETS["feta"]) == 1.0
    assert default_nsd_tolerance(PRESETS["brats"]) == 2.0
    assert default_nsd_tolerance(parse_regions("a=1")) == 2.0
    write_label_map(tmp_path / "ref" / "c.nii.gz", two_blobs().astype(np.uint8))
    with pytest.raises(UserError, match="--nsd-tolerance -1"):
        evaluate(str(tmp_path / "ref"), {"A": str(tmp_path / "ref")}, None, metrics=["nsd"], nsd_tolerance=-1,
                 progress=False)


def test_summary_json_input_refuses_mask_metrics(tmp_path):
    from nnunet_dro.errors import UserError

    write_label_map(tmp_path / "ref" / "c.nii.gz", two_blobs().astype(np.uint8))
    (tmp_path / "summary.json").write_text("{}")
    for metric in ("nsd", "topology"):
        with pytest.raises(UserError, match="summary.json has no"):
            evaluate(str(tmp_path / "ref"), {"A": str(tmp_path / "summary.json")}, None, metrics=[metric],
                     progress=False)
