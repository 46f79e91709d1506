"""Reading the evaluation's cases in worker processes (:func:`nnunet_dro.processes.map_in_processes`:
one future per case, a dead worker is a one-line error naming its cases, Ctrl-C handled once)."""
from __future__ import annotations

from typing import Callable, Sequence

from nnunet_dro.evaluation.metrics import CaseResult, CaseTask, evaluate_case
from nnunet_dro.processes import map_in_processes


def read_cases_in_pool(tasks: Sequence[CaseTask], workers: int,
                       on_result: Callable[[CaseResult], None] = lambda result: None
                       ) -> dict[str, CaseResult]:
    """Run :func:`evaluate_case` for every task in ``workers`` processes; results by case.

    A UserError of any case (raised in a worker) is re-raised here after the cases not yet
    started are cancelled. A worker that dies is a UserError naming the cases it may have been
    reading. Nothing is left running when this returns or raises.
    """
    # evaluate_case as bound here at import: a test's start-up hook may have wrapped it first
    results = map_in_processes(evaluate_case, tasks, [task.case for task in tasks], workers, on_result,
                               preload=[__name__])
    return {result.case: result for result in results}
