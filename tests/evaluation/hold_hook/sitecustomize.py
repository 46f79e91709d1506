"""Test-only start-up hook that holds one case's evaluation worker until the test acts.

A fault test (``tests/evaluation/test_eval_faults.py``) must land its fault inside a case by
construction, not by racing the machine's speed: a test that waited for a large case to make a
worker grow by 100 MB failed on a fast machine, where all 240 cases were read before any worker's
memory crossed the threshold. With this folder first on ``PYTHONPATH`` and
``NNUNET_DRO_TEST_HOLD_CASE=CASE``, the worker that starts CASE writes its pid to
``NNUNET_DRO_TEST_HOLD_FILE`` and waits, inside the case, until the test kills it or creates
``<that file>.release``; the evaluation cannot end before. Every other process (and every process
without the variable) runs unchanged.

Python imports ``sitecustomize`` at start-up in every interpreter with this folder on its path:
the CLI, its forkserver (which preloads the workers module, so the wrapper is in place before
``nnunet_dro.evaluation.workers`` binds ``evaluate_case``) and the workers forked from it.
"""
import os

_CASE = os.environ.get("NNUNET_DRO_TEST_HOLD_CASE")

if _CASE:
    import time

    import nnunet_dro.evaluation.metrics as _metrics

    _original = _metrics.evaluate_case

    def _held_evaluate_case(task):
        if task.case == _CASE:
            marker = os.environ["NNUNET_DRO_TEST_HOLD_FILE"]
            partial = f"{marker}.{os.getpid()}"
            with open(partial, "w") as f:
                f.write(str(os.getpid()))
            os.replace(partial, marker)  # the test never reads half a pid
            while not os.path.exists(marker + ".release"):
                time.sleep(0.01)
        return _original(task)

    _metrics.evaluate_case = _held_evaluate_case
