"""Label noise as it happens in real releases, for the robustness benchmark's dirty-data condition.

Public segmentation releases contain cases whose labels are wrong in a few typical ways. Three are
made here, each on a whole training label map (the images and every test case stay clean):

- ``erase``: one structure present in the map is set to background (a partial annotation);
- ``swap``: two structures present exchange their labels (a label-table mix-up);
- ``shift``: the whole map moves by ``shift`` voxels along one axis, zero-filled (a misregistered
  annotation).

DRO draws the cases with the highest loss more often, and a wrongly labelled case keeps a high loss
however well the network learns: the noisy cases' share of the draws tells whether it chases them.

>>> seg = np.zeros((6, 6, 6), np.uint8); seg[1:3, 1:3, 1:3] = 1; seg[3:5, 3:5, 3:5] = 2
>>> rng = np.random.default_rng(0)
>>> sorted(np.unique(corrupt(seg, "erase", rng)[0]).tolist()) in ([0, 1], [0, 2])
True
>>> swapped, what = corrupt(seg, "swap", rng); what
'labels 1 and 2 swapped'
>>> int((swapped == 1).sum()) == int((seg == 2).sum())
True
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import nibabel as nib
import numpy as np

from nnunet_dro.atomic import atomic_path, write_text_atomic
from nnunet_dro.errors import UserError

KINDS = ("erase", "swap", "shift")
RECORD = "label_noise.json"


def corrupt(seg: np.ndarray, kind: str, rng: np.random.Generator, shift: int = 3) -> tuple[np.ndarray, str]:
    """One corrupted copy of the label map ``seg`` and what was done, in words."""
    present = [int(v) for v in np.unique(seg) if v != 0]
    out = seg.copy()
    if kind == "erase" and present:
        label = int(rng.choice(present))
        out[seg == label] = 0
        return out, f"label {label} erased"
    if kind == "swap" and len(present) >= 2:
        a, b = (int(v) for v in rng.choice(present, size=2, replace=False))
        a, b = min(a, b), max(a, b)
        out[seg == a], out[seg == b] = b, a
        return out, f"labels {a} and {b} swapped"
    if kind == "shift":
        axis = int(rng.integers(seg.ndim))
        step = int(shift) * int(rng.choice([-1, 1]))
        out = np.roll(seg, step, axis=axis)
        index = [slice(None)] * seg.ndim
        index[axis] = slice(0, step) if step > 0 else slice(step, None)
        out[tuple(index)] = 0
        return out, f"shifted by {step} voxels along axis {axis}"
    if kind not in KINDS:
        raise UserError(f"label noise kind {kind!r}: choose one of {', '.join(KINDS)}")
    return out, f"{kind}: not applicable (labels present: {present}), left unchanged"


def choose_noisy_cases(groups: dict[str, str], count: int, minority_groups: Sequence[str], seed: int) -> list[str]:
    """``count`` training cases, half of them (rounded up) from the minority groups and the rest
    from the others, drawn with ``seed``; sorted."""
    if count < 0 or count > len(groups):
        raise UserError(f"--label-noise {count}: must lie between 0 and the {len(groups)} training cases")
    rng = np.random.default_rng(seed)
    minority = sorted(c for c, g in groups.items() if g in minority_groups)
    majority = sorted(c for c, g in groups.items() if g not in minority_groups)
    from_minority = min(len(minority), math.ceil(count / 2))
    from_majority = min(len(majority), count - from_minority)
    from_minority = count - from_majority
    chosen = list(rng.choice(minority, from_minority, replace=False)) if from_minority else []
    chosen += list(rng.choice(majority, from_majority, replace=False)) if from_majority else []
    return sorted(str(c) for c in chosen)


def corrupt_training_labels(labels_dir: str | Path, groups: dict[str, str], count: int,
                            minority_groups: Sequence[str], seed: int, record: str | Path,
                            file_ending: str = ".nii.gz") -> list[dict]:
    """Corrupt ``count`` training label files of ``labels_dir`` in place (kinds in turn: erase,
    swap, shift; each file rewritten atomically) and write what was done to ``record`` (JSON);
    returns its rows. The shift is an eighth of the smallest image side (at least 2 voxels)."""
    labels_dir = Path(labels_dir)
    rng = np.random.default_rng(seed + 7919)
    rows = []
    for i, case in enumerate(choose_noisy_cases(groups, count, minority_groups, seed)):
        path = labels_dir / f"{case}{file_ending}"
        if not path.is_file():
            raise UserError(f"{path}: label file of training case {case} not found")
        image = nib.load(str(path))
        seg = np.asarray(image.dataobj)
        kind = KINDS[i % len(KINDS)]
        noisy, what = corrupt(seg, kind, rng, shift=max(2, min(seg.shape) // 8))
        with atomic_path(path) as tmp:
            nib.save(nib.Nifti1Image(noisy.astype(seg.dtype), image.affine, image.header), str(tmp) + file_ending)
            Path(str(tmp) + file_ending).replace(tmp)
        rows.append({"case": case, "group": groups[case], "kind": kind, "what": what})
    write_text_atomic(record, json.dumps(rows, indent=2))
    return rows
