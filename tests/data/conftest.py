"""Fixtures shared by the data tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def raw(tmp_path, monkeypatch) -> Path:
    """An empty ``$nnUNet_raw`` for the converters; the other nnU-Net paths unset."""
    raw = tmp_path / "nnUNet_raw"
    monkeypatch.setenv("nnUNet_raw", str(raw))
    for variable in ("nnUNet_preprocessed", "nnUNet_results"):
        monkeypatch.delenv(variable, raising=False)
    return raw
