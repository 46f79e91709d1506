"""Structural checks of an nnU-Net raw dataset, shared by the tests of tests/data.

The same facts nnU-Net's ``verify_dataset_integrity`` checks (file naming, one label per training
case, matching shapes and spacings, label values within dataset.json), without its process pool
and torch import, so unit tests stay fast. (nnU-Net's own check and planner were run by hand on
the synthetic cohorts: ``nnUNetv2_plan_and_preprocess -c 3d_fullres --verify_dataset_integrity``.)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import SimpleITK as sitk


def assert_valid_raw_dataset(folder: Path) -> pd.DataFrame:
    """Assert ``folder`` is a consistent nnU-Net v2 raw dataset; return its subgroup table."""
    dataset = json.loads((folder / "dataset.json").read_text())
    ending = dataset["file_ending"]
    channels = len(dataset["channel_names"])
    allowed = set()
    for value in dataset["labels"].values():
        allowed.update(value if isinstance(value, list) else [value])
    table = pd.read_csv(folder / "subgroups.tsv", sep="\t", dtype={"case": str})
    assert list(table.columns)[0] == "case" and table["case"].is_unique
    counts = {}
    for images_dir, labels_dir, split in (("imagesTr", "labelsTr", "train"),
                                          ("imagesTs", "labelsTs", "test")):
        cases = sorted(p.name[: -len(ending)] for p in (folder / labels_dir).glob(f"*{ending}")) \
            if (folder / labels_dir).is_dir() else []
        image_files = sorted((folder / images_dir).glob(f"*{ending}")) \
            if (folder / images_dir).is_dir() else []
        assert len(image_files) == channels * len(cases), (images_dir, len(image_files))
        for case in cases:
            label = sitk.ReadImage(str(folder / labels_dir / f"{case}{ending}"))
            values = set(np.unique(sitk.GetArrayViewFromImage(label)).tolist())
            assert values <= allowed, (case, values - allowed)
            for channel in range(channels):
                image = sitk.ReadImage(str(folder / images_dir / f"{case}_{channel:04d}{ending}"))
                assert image.GetSize() == label.GetSize(), case
                assert np.allclose(image.GetSpacing(), label.GetSpacing()), case
                assert np.allclose(image.GetOrigin(), label.GetOrigin()), case
                assert np.isfinite(sitk.GetArrayViewFromImage(image)).all(), case
        assert sorted(table.loc[table["split"] == split, "case"]) == cases, split
        counts[split] = len(cases)
    assert dataset["numTraining"] == counts["train"]
    return table
