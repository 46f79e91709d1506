"""The one process pool every parallel command uses (``nnunet_dro.processes``): order kept, a case's
error re-raised, a dead worker a one-line error naming its case, nothing left running.

The functions are builtins, which a worker imports by name whatever its ``sys.path``. The end-to-end
faults (a worker killed inside a case, Ctrl-C) are tests/evaluation/test_eval_faults.py's.
"""
from __future__ import annotations

import multiprocessing
import os

import pytest

from nnunet_dro.errors import UserError
from nnunet_dro.processes import map_in_processes


def test_results_come_back_in_the_order_of_the_jobs():
    jobs = list(range(-20, 20, 3))
    assert map_in_processes(abs, jobs, [f"c{i}" for i in range(len(jobs))], workers=2) == [abs(j) for j in jobs]


def test_on_result_is_called_once_per_job_in_the_parent():
    seen = []
    map_in_processes(len, ["a", "bb", "ccc"], ["a", "b", "c"], workers=2, on_result=seen.append)
    assert sorted(seen) == [1, 2, 3]


def test_a_cases_error_is_re_raised_and_nothing_is_left_running():
    with pytest.raises(ValueError, match="'not a number'"):
        map_in_processes(int, ["1", "not a number", "3"], ["a", "b", "c"], workers=2)
    assert multiprocessing.active_children() == []


def test_a_worker_that_dies_is_a_user_error_naming_its_case():
    # os._exit(3) ends the worker inside the case without a Python exception: the pool breaks
    with pytest.raises(UserError, match=r"^a worker process died while reading case only \(killed by a signal"):
        map_in_processes(os._exit, [3], ["only"], workers=1)
    assert multiprocessing.active_children() == []


def test_every_job_needs_a_case_name():
    with pytest.raises(ValueError, match="2 jobs but 1 case names"):
        map_in_processes(abs, [1, 2], ["a"], workers=2)
