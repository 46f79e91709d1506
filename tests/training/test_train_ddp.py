"""DDP: ranks all-gather their (case, loss) pairs each iteration and so hold the same loss vector.

nnU-Net's own DDP path needs CUDA (NCCL); here two real processes join a CPU (gloo) process group
and run the trainer's sampler update with different, unevenly sized batches. The weighting starts
from an explicit vector here, so this test cannot see the start-up noise or the resume: the real
trainer's start, epochs and ``--c`` on two ranks are in ``test_train_ddp_trainer.py``.
"""
from __future__ import annotations

import multiprocessing
import os
import socket

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # two spawned processes import torch and nnU-Net

from nnunet_dro.sampling import all_gather_updates
from nnunet_dro.weighting import AdaptiveHardnessWeighting

WORLD = 2
STEPS = 4
NUM_CASES = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        # own RNG stream per rank (seed + rank, as the trainer does with dro_seed); the adaptive
        # scheme, whose beta also follows the gathered losses
        weighting = AdaptiveHardnessWeighting(NUM_CASES, fraction=0.5, init_loss=np.linspace(0.5, 1.0, NUM_CASES),
                                              seed=123 + rank)
        rng = np.random.default_rng(rank)
        drawn = []
        for _ in range(STEPS):
            idx, beta = weighting.sample_with_beta(2 + rank)  # nnU-Net splits the global batch unevenly
            drawn.append(idx.tolist())
            fresh = rng.uniform(-1.0, 0.0, idx.size)
            weighting.weights(idx, fresh, beta)
            # what the trainer's train_step does after its optimiser step
            weighting.update(*all_gather_updates(idx, fresh, np.full(idx.size, beta)))
        results.put((rank, np.array(weighting.losses), np.array(weighting.draw_counts),
                     weighting.counters.num_weights, weighting.current_beta, drawn))
    finally:
        dist.destroy_process_group()


def _get_result(results, procs, timeout: float = 240.0):
    """The next rank's result; fail at once (not after the timeout) if a rank died."""
    import queue
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=2)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a rank exited with code {dead[0]} (its traceback is in the captured stderr)"
    raise AssertionError("no result from the ranks within the timeout")


def _run_ranks(target) -> list:
    """Run ``target(rank, port, results)`` on WORLD spawned gloo ranks; their results, by rank."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, port, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        out = sorted(_get_result(results, procs) for _ in range(WORLD))
    finally:
        for p in procs:
            p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs)
    return out


def test_ranks_hold_the_same_loss_vector_after_all_gathered_updates():
    out = _run_ranks(_rank_main)
    (_, losses0, counts0, weights0, beta0, drawn0), (_, losses1, counts1, weights1, beta1, drawn1) = out
    np.testing.assert_array_equal(losses0, losses1)
    assert beta0 == beta1                            # the adaptive beta is the same on every rank
    np.testing.assert_array_equal(counts0, counts1)
    assert counts0.sum() == STEPS * (2 + 3)          # every rank saw every rank's pairs
    assert weights0 == weights1 == STEPS * (2 + 3)    # clipped-weight statistics are global too
    assert drawn0 != drawn1                           # but each rank draws from its own stream


def _error_set_rank_main(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    from nnunet_dro.sampling.distributed import broadcast_indices
    from nnunet_dro.weighting import ErrorSetWeighting

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        # each rank its own draws; coarse losses, so ties at the boundary are likely
        weighting = ErrorSetWeighting(NUM_CASES, upweight=5.0, seed=321 + rank)
        rng = np.random.default_rng(rank)
        for _ in range(3 * STEPS):
            idx, _ = weighting.sample_with_beta(2 + rank)
            fresh = np.round(rng.uniform(0.0, 1.0, idx.size), 1)
            weighting.update(*all_gather_updates(idx, fresh))
        choice = weighting.fix(0.2, epoch=3)
        # what the trainer adds on top: rank 0's set everywhere, even where a rank chose another one
        mine = list(choice.cases) if rank == 0 else [NUM_CASES - 1]
        agreed = broadcast_indices(mine).tolist()
        results.put((rank, list(choice.cases), agreed, weighting.selection_losses().tolist(),
                     weighting.probabilities().tolist()))
    finally:
        dist.destroy_process_group()


def test_ranks_choose_the_same_error_set_from_the_gathered_losses_and_take_rank_0s():
    out = _run_ranks(_error_set_rank_main)
    (_, set0, agreed0, losses0, p0), (_, set1, agreed1, losses1, p1) = out
    assert losses0 == losses1          # the same stale losses (never-drawn cases: inf on both)
    assert set0 == set1 and len(set0) >= 2 and p0 == p1
    assert agreed0 == agreed1 == set0  # rank 1 offered another set and got rank 0's
