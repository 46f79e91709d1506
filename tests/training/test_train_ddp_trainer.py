"""DDP with the real trainer: two gloo ranks on CPU run ``nnUNetTrainerDRO`` (nnU-Net's own
``run_training``, checkpoints and ``--c``) and must hold the same case weighting throughout.

nnU-Net's DDP path is CUDA-only in two places, and only those are patched inside the ranks: the
trainer's constructor sets ``cuda:<rank>`` (and a CUDA GradScaler) for every DDP rank, and
``initialize()`` wraps the network in ``DDP(..., device_ids=[rank])``. Everything else (the batch
split over ranks, the all-gathered updates, the gathered pseudo-Dice, rank-0-only checkpoints,
``maybe_load_checkpoint``) is nnU-Net's and ours as shipped. ``nnUNet_n_proc_DA=0``: the draws
happen in each rank's main process, so each rank's own random stream is the one in the checkpoint.

Unlike ``test_train_ddp.py`` (an explicit starting vector), the weighting starts from ``L_init``
with its tie-breaking noise, as in a real run.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import time

import numpy as np
import pytest
import torch
from batchgenerators.utilities.file_and_folder_operations import load_json

from nnunet_dro.training import nnUNetTrainerDRO
from nnunet_dro.training.short_run import SHORT_RUN_ENV, ShortRun

pytestmark = [pytest.mark.slow,  # two spawned ranks import torch and nnU-Net and train, twice
              pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]

WORLD = 2


class nnUNetTrainerDRO_ddpTest(ShortRun, nnUNetTrainerDRO):
    """nnUNetTrainerDRO, short (nnUNet_dro_short_run), recording what each rank holds after every
    training epoch (the recording only reads the weighting)."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device('cuda')):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.snapshots = []
        self.drawn = []

    def train_step(self, batch: dict) -> dict:
        self.drawn.append([str(k) for k in batch["keys"]])
        return super().train_step(batch)

    def on_train_epoch_end(self, train_outputs):
        super().on_train_epoch_end(train_outputs)
        w = self.case_weighting
        self.snapshots.append({"epoch": self.current_epoch, "losses": np.array(w.losses), "p": w.probabilities(),
                               "counts": np.array(w.draw_counts),
                               "hardest": [c for c, _ in self._dro_history["hardest"][-1]]})


def rng_states(state, prefix: str = "") -> dict:
    """Every random-stream state (key 'rng_state') in a weighting state, by its path."""
    found = {}
    if isinstance(state, dict):
        for key, value in state.items():
            if key == "rng_state":
                found[prefix + key] = value
            else:
                found.update(rng_states(value, f"{prefix}{key}/"))
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, env: dict, resume: bool, results) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import nnunetv2.training.nnUNetTrainer.nnUNetTrainer as nnunet_trainer_module
    import torch.distributed as dist
    from nnunetv2.run.run_training import maybe_load_checkpoint
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        # nnU-Net's CUDA-only choice 1: DDP(network, device_ids=[rank]); a CPU module takes none
        nnunet_trainer_module.DDP = lambda module, device_ids=None, **kw: DistributedDataParallel(module, **kw)
        folder = os.path.join(env["nnUNet_preprocessed"], env["DDP_TEST_DATASET"])
        plans = load_json(os.path.join(folder, "nnUNetPlans.json"))
        plans["continue_training"] = resume  # as nnUNetv2_train's get_trainer_from_args puts it
        trainer = nnUNetTrainerDRO_ddpTest(plans, "3d_fullres", 0, load_json(os.path.join(folder, "dataset.json")),
                                           device=torch.device("cpu"))
        # nnU-Net's CUDA-only choice 2: every DDP rank gets cuda:<rank> and a CUDA GradScaler
        trainer.device, trainer.grad_scaler = torch.device("cpu"), None
        assert trainer.is_ddp and trainer.local_rank == rank
        trainer.initialize()
        at_start = np.array(trainer.case_weighting.losses)
        maybe_load_checkpoint(trainer, resume, False, None)  # what nnUNetv2_train -num_gpus 2 [--c] does
        streams_after_load = rng_states(trainer.case_weighting.state_dict())
        trainer.run_training()
        results.put({"rank": rank, "at_start": at_start, "streams_after_load": streams_after_load,
                     "final_streams": rng_states(trainer._dro_final_state["weighting"]),
                     "snapshots": trainer.snapshots, "drawn": trainer.drawn,
                     "batch_size": trainer.batch_size})
    finally:
        dist.destroy_process_group()


def _run_ranks(env: dict, resume: bool) -> list:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, env, resume, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = []
    try:
        deadline = time.monotonic() + 600
        while len(out) < WORLD:
            assert time.monotonic() < deadline, "no result from the ranks within 600 s"
            try:
                out.append(results.get(timeout=2))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a rank exited with code {dead[0]} (its traceback is in the captured stderr)"
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return sorted(out, key=lambda r: r["rank"])


def _assert_same_weighting(rank0: dict, rank1: dict) -> None:
    assert len(rank0["snapshots"]) == len(rank1["snapshots"]) > 0
    for s0, s1 in zip(rank0["snapshots"], rank1["snapshots"]):
        # bitwise: every rank folds the same gathered updates into the same starting state
        np.testing.assert_array_equal(s0["losses"], s1["losses"], err_msg=f"loss vectors, epoch {s0['epoch']}")
        np.testing.assert_array_equal(s0["p"], s1["p"], err_msg=f"probabilities, epoch {s0['epoch']}")
        np.testing.assert_array_equal(s0["counts"], s1["counts"])
        assert s0["hardest"] == s1["hardest"], f"hardest-case order, epoch {s0['epoch']}"


def test_every_rank_holds_the_same_weighting_through_training_and_resume(label_dataset, tmp_path):
    ds = label_dataset
    results = tmp_path / "results"
    results.mkdir()
    env = {k: ds.env[k] for k in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_compile", "nnUNet_def_n_proc",
                                  "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update({"nnUNet_results": str(results), "nnUNet_n_proc_DA": "0", "DDP_TEST_DATASET": ds.folder_name,
                SHORT_RUN_ENV: "2x2x1"})
    env.pop("nnUNet_dro_seed", None)  # the default: no seed, each rank's stream from fresh entropy

    first = _run_ranks(env, resume=False)
    r0, r1 = first
    assert r0["batch_size"] == r1["batch_size"] == 1  # nnU-Net split the global batch of 2 over the ranks
    # the starting state, tie-breaking noise included, is rank 0's on every rank
    np.testing.assert_array_equal(r0["at_start"], r1["at_start"])
    assert np.ptp(r0["at_start"]) > 0  # the noise is there (ties broken)
    _assert_same_weighting(r0, r1)
    assert r0["snapshots"][-1]["counts"].sum() == 2 * 2 * WORLD  # every rank saw every rank's draws
    # each rank draws from a stream of its own
    assert r0["final_streams"] != r1["final_streams"]

    env[SHORT_RUN_ENV] = "3x2x1"  # --c from checkpoint_final.pth, one epoch more
    second = _run_ranks(env, resume=True)
    s0, s1 = second
    # each rank resumes its own stream, not rank 0's
    assert s0["streams_after_load"] == r0["final_streams"]
    assert s1["streams_after_load"] == r1["final_streams"]
    assert [s["epoch"] for s in s0["snapshots"]] == [2]
    _assert_same_weighting(s0, s1)
    assert s0["snapshots"][-1]["counts"].sum() == 3 * 2 * WORLD


@pytest.mark.parametrize("trainer_name, why", [("nnUNetTrainerL2RW", "normalised per GPU"),
                                              ("nnUNetTrainerDROLS", "segmentation heads outside DDP's forward"),
                                              ("nnUNetTrainerDROLS_DRO", "segmentation heads outside DDP's forward")])
def test_trainers_not_correct_under_ddp_refuse_it_in_one_line(label_dataset, monkeypatch, trainer_name, why):
    """L2RW's weights are normalised over one rank's part of the batch, and GI-LS re-runs the heads
    outside DDP's forward: both stop before anything is built (a one-rank gloo group is DDP to nnU-Net)."""
    import torch.distributed as dist

    import nnunet_dro.training as training

    ds = label_dataset
    for key in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        monkeypatch.setenv(key, ds.env[key])
    folder = ds.preprocessed / ds.folder_name
    plans = load_json(str(folder / "nnUNetPlans.json"))
    plans["continue_training"] = False
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        trainer = None
        with pytest.raises(RuntimeError) as err:
            trainer = getattr(training, trainer_name)(plans, "3d_fullres", 0, load_json(str(folder / "dataset.json")),
                                                      device=torch.device("cpu"))
            trainer.device, trainer.grad_scaler = torch.device("cpu"), None
            trainer.initialize()
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"{trainer_name} does not run under DDP"), message
        assert why in message and "train it on one GPU" in message
        assert trainer is None or not trainer.was_initialized
    finally:
        dist.destroy_process_group()
