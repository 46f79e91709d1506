"""How ``make test`` spreads the suite over processes (pytest-xdist, ``-n auto --dist loadgroup``).

Each test file is one unit of work, so its module and session fixtures (a planned nnU-Net dataset,
a trained model) are built once per worker that runs it, not once per test. Files that watch
``/dev/shm`` or kill process groups share one unit (``dev_shm``): ``nnunet_dro cleanup-shm`` in one
of them would otherwise remove the orphaned blocks another file is about to check. The units with
the longest end-to-end runs are handed out first, so that no worker starts a five-minute test when
the others are nearly done. A plain ``pytest`` (no ``-n``) runs everything in one process, in the
same order.

Two tiers (``make test``: ``-m "not lab"``; ``make test-lab``: ``-m lab``): every test under
``tests/lab/``, the files in ``LAB_FILES`` and single tests marked ``@pytest.mark.lab`` are the lab's
(the benchmark, tutorial, demo, GPU check and the scripts' runs, which measure the product rather
than test it); the rest is the product's suite.
"""
from __future__ import annotations

from pathlib import Path

import pytest

# Files whose tests create, kill or clean up /dev/shm blocks and semaphores of whole process trees.
SHARED_MEMORY_FILES = ("test_train_e2e.py", "test_sampler_processes.py", "test_eval_faults.py",
                       "test_data_label_audit.py",  # its multiprocessing pools make semaphores
                       "test_train_error_set_e2e.py")  # kills a training's process group, runs cleanup-shm
LAB_DIR = Path(__file__).resolve().parent / "lab"
# Lab files outside tests/lab/ (they run a script of scripts/, not a product command).
LAB_FILES = ("test_wf_gpu_check.py", "test_wf_benchmark_overhead.py")
# The longest units, longest first (pytest --durations on 2 cores, November 2026); every other file
# keeps its place in the collection order after them.
LONGEST_FIRST = ("test_tutorial.py", "test_wf_benchmark_robustness.py", "dev_shm", "test_wf_gpu_check.py",
                 "test_wf_demo.py", "test_train_export.py", "test_train_guard.py", "test_train_cohort_e2e.py")


def _unit(item: pytest.Item) -> str:
    name = item.path.name
    return "dev_shm" if name in SHARED_MEMORY_FILES else name


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if LAB_DIR in item.path.parents or item.path.name in LAB_FILES:
            item.add_marker(pytest.mark.lab)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_unit(item)))
    rank = {unit: position for position, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_unit(item), len(rank)))  # stable: the rest keep their order
