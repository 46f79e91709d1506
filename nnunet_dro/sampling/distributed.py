"""Keep the samplers of all ``torch.distributed`` ranks identical.

Each rank draws and computes losses for its own part of the global batch. Gathering every rank's
(indices, losses) and applying the same updates everywhere keeps one loss vector across ranks,
as if one process had seen the whole batch.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def all_gather_updates(indices: ArrayLike, losses: ArrayLike, *extra: ArrayLike
                       ) -> tuple[NDArray, ...]:
    """All-gather (indices, losses, *extra) from every rank, in rank order.

    ``extra``: more per-sample float vectors to gather alongside (e.g. the beta each case was
    drawn with). Returns the inputs unchanged (as arrays) if torch.distributed is not
    initialised. Ranks may contribute different batch sizes (nnU-Net splits the global batch
    unevenly).
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    val = np.asarray(losses, dtype=np.float64).reshape(-1)
    more = [np.asarray(e, dtype=np.float64).reshape(-1) for e in extra]
    if any(m.shape != val.shape for m in more):
        raise ValueError("every extra vector must have one value per index")
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return (idx, val, *more)
    world = dist.get_world_size()
    # NCCL only moves CUDA tensors; gloo (CPU) moves CPU tensors.
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    size = torch.tensor([idx.size], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    sizes = [int(s.item()) for s in sizes]
    width = max(sizes)
    rows = [idx.astype(np.float64), val, *more]  # indices are exact in float64 below 2**53
    packed = torch.zeros((len(rows), width), dtype=torch.float64, device=device)
    for r, row in enumerate(rows):
        packed[r, :row.size] = torch.from_numpy(row)
    gathered = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(gathered, packed)
    out = [np.concatenate([g[r, :s].cpu().numpy() for g, s in zip(gathered, sizes)]) for r in range(len(rows))]
    return (out[0].astype(np.int64), *out[1:])


def broadcast_indices(indices: ArrayLike) -> NDArray[np.int64]:
    """Rank 0's integer vector on every rank (its length may differ from the other ranks' input).

    A choice that every rank must share (the error set of ``ErrorSetWeighting``) is taken from
    rank 0 rather than trusted to be computed identically everywhere. Returns the input unchanged
    (as an array) if torch.distributed is not initialised.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return idx
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    size = torch.tensor([idx.size], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    values = torch.zeros(int(size.item()), dtype=torch.int64, device=device)
    if dist.get_rank() == 0:
        values.copy_(torch.from_numpy(idx))
    dist.broadcast(values, src=0)
    return values.cpu().numpy().astype(np.int64)
