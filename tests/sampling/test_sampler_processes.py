"""The shared sampler across real processes: fork, spawn, concurrent writers, leaks, gloo DDP."""
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy import stats

from nnunet_dro.sampling import HardnessWeightedSampler, all_gather_updates

N = 8
DRAWS = 20000


def _draw_after_signal(sampler, go, results):
    """Worker: wait until the parent has updated the losses, then draw."""
    go.wait(timeout=60)
    results.put(np.bincount(sampler.sample(DRAWS), minlength=N).tolist())


def _shm_path(name):
    return os.path.join("/dev/shm", name.lstrip("/"))


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_worker_draws_follow_the_parents_update(method):
    ctx = mp.get_context(method)
    with HardnessWeightedSampler(N, beta=10.0, init_loss=0.0, seed=1, shared=True) as s:
        go, results = ctx.Event(), ctx.Queue()
        worker = ctx.Process(target=_draw_after_signal, args=(s, go, results))
        worker.start()  # the worker holds a copy made *before* the update
        s.update(np.arange(N), np.where(np.arange(N) == 2, 0.1, 0.0))  # p_2: 1/8 -> e/(7+e)
        go.set()
        counts = np.array(results.get(timeout=120))
        worker.join(timeout=60)
        assert worker.exitcode == 0
        expected = s.probabilities() * DRAWS
    # every cell expects > 1400 draws: the chi-square approximation is sound. The worker's
    # stream depends on its pid, hence a strict threshold rather than a fixed outcome.
    assert expected[2] / DRAWS == pytest.approx(np.e / (7 + np.e))
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    stale = np.full(N, DRAWS / N)  # what a worker that never saw the update would draw
    assert stats.chisquare(counts, stale).pvalue < 1e-12


def _hammer_draws(sampler, stop, results, drawing):
    bad = 0
    total = 0
    while not stop.is_set():
        idx = sampler.sample(4)
        bad += int(((idx < 0) | (idx >= sampler.num_cases)).sum())
        total += idx.size
        drawing.set()  # the owner starts writing only once every reader draws
    results.put((bad, total, bool(np.all(np.isfinite(sampler.probabilities())))))


def test_readers_never_see_invalid_indices_while_the_owner_writes():
    ctx = mp.get_context("fork")
    rng = np.random.default_rng(0)
    with HardnessWeightedSampler(1000, beta=100.0, shared=True, seed=0) as s:
        stop, results = ctx.Event(), ctx.Queue()
        drawing = [ctx.Event() for _ in range(2)]
        readers = [ctx.Process(target=_hammer_draws, args=(s, stop, results, d)) for d in drawing]
        for r in readers:
            r.start()
        # by construction, not by the machine's speed: on a busy machine the 3000 writes could end
        # (and stop be set) before a reader had drawn once, and the test would check nothing
        assert all(d.wait(timeout=120) for d in drawing), "a reader never started drawing"
        for step in range(3000):
            idx = rng.integers(0, 1000, 4)
            # alternate wild scales so that re-centring rebuilds happen under the readers
            scale = 50.0 if step % 500 < 250 else 0.01
            s.update(idx, rng.normal(0, scale, 4))
        stop.set()
        outcomes = [results.get(timeout=60) for _ in readers]
        for r in readers:
            r.join(timeout=60)
    for bad, total, finite in outcomes:
        assert total > 0 and bad == 0 and finite


def test_owner_unlinks_on_close_and_on_exception():
    s = HardnessWeightedSampler(10, shared=True)
    path = _shm_path(s._storage.name)
    assert os.path.exists(path)
    s.close()
    s.close()  # idempotent
    assert not os.path.exists(path)
    with pytest.raises(RuntimeError):
        with HardnessWeightedSampler(10, shared=True) as t:
            path = _shm_path(t._storage.name)
            raise RuntimeError("training crashed")
    assert not os.path.exists(path)


def _attach_and_exit(sampler, results):
    results.put(float(sampler.losses[0]))


def test_workers_never_unlink_and_a_crashed_owner_leaves_no_segment(tmp_path):
    ctx = mp.get_context("fork")
    with HardnessWeightedSampler(10, init_loss=0.25, shared=True) as s:
        path = _shm_path(s._storage.name)
        for method in ("fork", "spawn"):
            c = mp.get_context(method)
            q = c.Queue()
            p = c.Process(target=_attach_and_exit, args=(s, q))
            p.start()
            assert q.get(timeout=60) == pytest.approx(0.25, abs=1e-5)
            p.join(timeout=60)
            assert os.path.exists(path), f"a {method} worker unlinked the owner's block"
    # an owner process that dies of an uncaught exception without close() still cleans up
    script = textwrap.dedent("""
        import sys
        from nnunet_dro.sampling import HardnessWeightedSampler
        s = HardnessWeightedSampler(10, shared=True)
        print(s._storage.name, flush=True)
        raise SystemExit(3)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert not os.path.exists(_shm_path(out.stdout.strip()))
    del ctx


def test_a_sampler_never_closed_exits_quietly_and_removes_its_block():
    script = textwrap.dedent("""
        from nnunet_dro.sampling import HardnessWeightedSampler
        s = HardnessWeightedSampler(10, shared=True)
        s.update([1, 2], [0.5, 0.25])
        print(s._storage.name, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    name = out.stdout.strip()
    assert name.startswith("nnunet_dro_") and not os.path.exists(_shm_path(name))


def _orphan_and_clean_up(alive_path: str) -> bool:
    """Leave a block orphaned (its owner killed with its resource tracker), then list it and remove
    it with ``nnunet_dro cleanup-shm``. False if another process removed the orphan first: every
    shared sampler created anywhere (a DRO training in another pytest worker) removes orphans at
    start, which is the feature, but leaves this run nothing to check."""
    import signal
    # owner and its resource tracker die together, as in a process-group or cgroup OOM kill
    script = textwrap.dedent("""
        import sys, time
        from nnunet_dro.sampling import HardnessWeightedSampler
        s = HardnessWeightedSampler(10, shared=True)
        print(s._storage.name, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    name = proc.stdout.readline().strip()
    path = _shm_path(name)
    assert name.startswith(f"nnunet_dro_{proc.pid}_") and os.path.exists(path)
    listed = subprocess.run([sys.executable, "-m", "nnunet_dro", "cleanup-shm", "--dry-run"],
                            capture_output=True, text=True, timeout=60)
    assert path not in listed.stdout  # its owner is still running
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    if not os.path.exists(path):
        return False  # removed by another process's start-up cleanup (or by its own tracker: checked below)
    listed = subprocess.run([sys.executable, "-m", "nnunet_dro", "cleanup-shm", "--dry-run"],
                            capture_output=True, text=True, timeout=60)
    if not os.path.exists(path):
        return False  # removed by another process while (or right after) it was listed
    assert listed.returncode == 0 and path in listed.stdout, listed.stdout
    removed = subprocess.run([sys.executable, "-m", "nnunet_dro", "cleanup-shm"],
                             capture_output=True, text=True, timeout=60)
    assert removed.returncode == 0 and not os.path.exists(path)
    assert os.path.exists(alive_path)
    return f"removed: {path}" in removed.stdout  # False: another process removed it first


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="orphans are listed from /dev/shm (Linux)")
def test_blocks_of_a_killed_process_group_are_removed_by_cleanup_shm_and_live_ones_kept():
    """Retried (at most 20 times, 2 s apart) only when another process removed the orphan before
    cleanup-shm could: a cleanup-shm that does not list an orphan that is still there, or does not
    remove it, or removes a live block, fails on the first run; a kill that leaves no orphan fails
    after the last attempt."""
    import time

    with HardnessWeightedSampler(4, shared=True) as alive:  # our own live block must survive
        alive_path = _shm_path(alive._storage.name)
        attempts = 1
        while not _orphan_and_clean_up(alive_path):
            assert attempts < 20, ("no attempt left an orphan for cleanup-shm to list and remove: another process "
                                   "removed each first, or the kill no longer kills the resource tracker")
            attempts += 1
            time.sleep(2.0)
        assert os.path.exists(alive_path)


def test_orphan_segments_are_recognised_by_name_and_dead_owner(tmp_path):
    from nnunet_dro.sampling.storage import orphan_segments, remove_orphan_segments
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    cases = {  # file name -> is an orphan
        f"nnunet_dro_{dead}_0123abcd": True,
        f"nnunet_dro_{os.getpid()}_0123abcd": False,  # owner alive
        f"nnunet_dro_{dead}_xyz": False,                # not our naming scheme
        f"psm_{dead}": False,                          # someone else's block
        f"nnunet_dro_{dead}_0123abcd.bak": False,
    }
    for name in cases:
        (tmp_path / name).write_bytes(b"\0" * 8)
    expected = sorted(tmp_path / n for n, orphan in cases.items() if orphan)
    assert orphan_segments(tmp_path) == expected
    assert remove_orphan_segments(tmp_path) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, o in cases.items() if not o)
    assert orphan_segments(tmp_path / "absent") == []


def test_private_sampler_pickles_by_value():
    import pickle
    with HardnessWeightedSampler(5, init_loss=[1, 2, 3, 4, 5], seed=0) as s:
        t = pickle.loads(pickle.dumps(s))
        s.update([0], [9.0])
        assert t.losses[0] == 1.0 and not t.shared  # an independent copy
        np.testing.assert_array_equal(t.losses[1:], s.losses[1:])


def _ddp_rank(rank, world, port, results):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        s = HardnessWeightedSampler(20, beta=10.0, init_loss=1.0, seed=42)  # same init everywhere
        rng = np.random.default_rng(rank)
        for step in range(25):
            idx = s.sample(2 + rank)  # uneven per-rank batch sizes, like nnU-Net's split
            losses = rng.uniform(0, 1, idx.size)
            all_idx, all_losses = all_gather_updates(idx, losses)
            assert all_idx.size == 2 + 3  # both ranks' contributions
            s.update(all_idx, all_losses)
        results.put((rank, s.losses.tolist(), s.draw_counts.tolist()))
    finally:
        dist.destroy_process_group()


def test_all_gather_updates_keeps_ranks_identical_with_gloo():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [ctx.Process(target=_ddp_rank, args=(r, 2, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((r, (l, c)) for r, l, c in (results.get(timeout=180) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert out[0] == out[1]
    assert sum(out[0][1]) == 25 * 5


def test_all_gather_without_distributed_is_identity():
    idx, val = all_gather_updates([1, 2], [0.5, 0.25])
    assert idx.tolist() == [1, 2] and val.tolist() == [0.5, 0.25]


def test_a_killed_owner_alone_leaves_its_block_to_the_resource_tracker():
    import signal
    import time
    script = textwrap.dedent("""
        import time
        from nnunet_dro.sampling import HardnessWeightedSampler
        s = HardnessWeightedSampler(10, shared=True)
        print(s._storage.name, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    path = _shm_path(proc.stdout.readline().strip())
    assert os.path.exists(path)
    proc.send_signal(signal.SIGKILL)  # the owner only: its resource tracker survives and cleans up
    proc.wait(timeout=60)
    proc.stdout.close()
    deadline = time.monotonic() + 30
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(path)
