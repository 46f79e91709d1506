"""Confusion tables, Dice/VS from counts, HD95 against a brute-force reference."""
import numpy as np
import pytest
from scipy.spatial.distance import cdist

from nnunet_dro.evaluation.io import Geometry
from nnunet_dro.evaluation.metrics import (
    confusion_table,
    dice_percent,
    hd95_empty_value,
    hd95_mm,
    region_counts,
    volume_similarity_percent,
)


def brute_force_table(ref, pred, labels):
    return np.array([[np.sum((ref == a) & (pred == b)) for b in labels] for a in labels])


@pytest.mark.parametrize("dtype,values", [
    (np.uint8, (0, 1, 2, 3)),          # uint8 fast path (n*n <= 256)
    (np.uint8, (0, 1, 7, 40)),         # uint8 widened path
    (np.int16, (0, 2, 5000, 9000)),    # large sparse labels: compacted with np.unique
    (np.uint16, (0, 3, 300)),
])
def test_confusion_table_matches_brute_force(dtype, values):
    rng = np.random.default_rng(1)
    ref = rng.choice(np.array(values, dtype), size=(6, 7, 5))
    pred = rng.choice(np.array(values, dtype), size=(6, 7, 5))
    labels, table = confusion_table(ref, pred)
    assert labels.tolist() == sorted(set(ref.ravel()) | set(pred.ravel()))
    np.testing.assert_array_equal(table, brute_force_table(ref, pred, labels))


def test_confusion_table_ignore_label_drops_reference_voxels():
    ref = np.array([0, 1, 1, 9, 9, 2])
    pred = np.array([0, 1, 2, 1, 2, 2])
    labels, table = confusion_table(ref, pred, ignore_label=9)
    n_ref, n_pred, tp = region_counts(labels, table, (1,))
    # nnU-Net: voxels where the reference is the ignore label count nowhere
    assert (n_ref, n_pred, tp) == (2, 1, 1)


@pytest.mark.parametrize("region", [(1,), (2,), (1, 2), (1, 2, 3), (5,)])
def test_region_counts_match_masks(region):
    rng = np.random.default_rng(2)
    ref = rng.integers(0, 4, size=(5, 5, 5)).astype(np.uint8)
    pred = rng.integers(0, 4, size=(5, 5, 5)).astype(np.uint8)
    labels, table = confusion_table(ref, pred)
    r, p = np.isin(ref, region), np.isin(pred, region)
    assert region_counts(labels, table, region) == (r.sum(), p.sum(), (r & p).sum())


@pytest.mark.parametrize("counts,empty,dice,vs", [
    ((10, 10, 10), "one", 100.0, 100.0),
    ((10, 30, 5), "one", 25.0, 50.0),
    ((0, 0, 0), "one", 100.0, 100.0),     # both empty: BraTS convention
    ((0, 0, 0), "nan", np.nan, np.nan),   # both empty: left out (nnU-Net)
    ((0, 5, 0), "nan", 0.0, 0.0),         # one side empty: plain zero whatever the policy
    ((5, 0, 0), "one", 0.0, 0.0),
])
def test_dice_and_volume_similarity_policies(counts, empty, dice, vs):
    np.testing.assert_equal(dice_percent(*counts, empty=empty), dice)
    np.testing.assert_equal(volume_similarity_percent(counts[0], counts[1], empty=empty), vs)


def brute_force_hd95(a, b, spacing):
    from scipy import ndimage
    structure = ndimage.generate_binary_structure(3, 1)
    sa = a & ~ndimage.binary_erosion(a, structure, border_value=0)
    sb = b & ~ndimage.binary_erosion(b, structure, border_value=0)
    pa = np.argwhere(sa) * np.asarray(spacing)
    pb = np.argwhere(sb) * np.asarray(spacing)
    d = cdist(pa, pb)
    return max(np.percentile(d.min(axis=1), 95), np.percentile(d.min(axis=0), 95))


@pytest.mark.parametrize("seed,spacing", [(0, (1.0, 1.0, 1.0)), (1, (2.0, 0.5, 0.7)), (2, (3.0, 1.0, 1.0)),
                                          (3, (1.0, 1.0, 1.0))])
def test_hd95_matches_brute_force(seed, spacing):
    rng = np.random.default_rng(seed)
    a = np.zeros((12, 12, 12), bool)
    b = np.zeros((12, 12, 12), bool)
    a[rng.integers(0, 5):rng.integers(6, 12), 2:9, 3:10] = True
    b[rng.integers(0, 5):rng.integers(6, 12), 4:12, 0:7] = True  # b touches the image border
    b[rng.random(b.shape) < 0.05] = True  # scattered voxels: many surface points
    np.testing.assert_allclose(hd95_mm(a, b, spacing), brute_force_hd95(a, b, spacing), rtol=1e-9)


def test_hd95_empty_values_follow_policy():
    geometry = Geometry(shape=(10, 20, 30), spacing=(2.0, 1.0, 1.0))
    diagonal = np.sqrt(20 ** 2 + 20 ** 2 + 30 ** 2)
    assert hd95_empty_value(0, 0, geometry, "one") == 0.0
    assert np.isnan(hd95_empty_value(0, 0, geometry, "nan"))
    assert hd95_empty_value(0, 4, geometry, "nan") == pytest.approx(diagonal)
    assert hd95_empty_value(4, 0, geometry, "one") == pytest.approx(diagonal)
    assert hd95_empty_value(4, 4, geometry, "one") is None
