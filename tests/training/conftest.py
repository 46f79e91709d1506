"""Session fixtures of the trainer tests: each synthetic dataset is planned and preprocessed once
(``nnUNetv2_plan_and_preprocess -np 2``); the nnU-Net folders live under a session tmp folder and
subprocesses get them through ``dataset.env``."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from train_helpers import TEST_TRAINER_MODULE, PreprocessedDataset, make_preprocessed_dataset


@pytest.fixture(scope="session")
def label_dataset(tmp_path_factory) -> PreprocessedDataset:
    """6 cases of 24^3, one channel, labels background/sphere; preprocessed 3d_fullres."""
    return make_preprocessed_dataset(tmp_path_factory.mktemp("nnunet_labels"), 901, "DROLabels", regions=False)


@pytest.fixture(scope="session")
def region_dataset(tmp_path_factory) -> PreprocessedDataset:
    """6 cases of 24^3 with BraTS-style overlapping regions (whole = {1, 2}, core = {2})."""
    return make_preprocessed_dataset(tmp_path_factory.mktemp("nnunet_regions"), 902, "DRORegions", regions=True)


@pytest.fixture(scope="session")
def test_trainer_dir(tmp_path_factory) -> Path:
    """A folder with a test-sized DRO trainer module, for nnUNet_extTrainer."""
    folder = tmp_path_factory.mktemp("ext_trainers_test")
    (folder / "dro_e2e_test_trainers.py").write_text(textwrap.dedent(TEST_TRAINER_MODULE))
    return folder
