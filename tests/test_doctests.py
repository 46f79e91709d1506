"""Every docstring example of the package runs (``python -m doctest`` semantics, one test per module)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil
import warnings

import pytest

import nnunet_dro

MODULES = sorted(m.name for m in pkgutil.walk_packages(nnunet_dro.__path__, "nnunet_dro.")
                 if not m.name.endswith("__main__"))


def test_the_package_has_modules_to_check():
    assert len(MODULES) > 40 and "nnunet_dro.evaluation.metrics" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
