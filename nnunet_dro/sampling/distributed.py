"""Keep the samplers of all ``torch.distributed`` ranks identical.

Each rank draws and computes losses for its own part of the global batch. Gathering every rank's
(indices, losses) and applying the same updates everywhere keeps one loss vector across ranks,
as if one process had seen the whole batch.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def all_gather_updates(indices: ArrayLike, losses: ArrayLike
                       ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """All-gather (indices, losses) from every rank, in rank order.

    Returns the inputs unchanged (as arrays) if torch.distributed is not initialised. Ranks may
    contribute different batch sizes (nnU-Net splits the global batch unevenly).
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    val = np.asarray(losses, dtype=np.float64).reshape(-1)
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return idx, val
    world = dist.get_world_size()
    # NCCL only moves CUDA tensors; gloo (CPU) moves CPU tensors.
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    size = torch.tensor([idx.size], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    sizes = [int(s.item()) for s in sizes]
    width = max(sizes)
    packed = torch.zeros((2, width), dtype=torch.float64, device=device)
    packed[0, :idx.size] = torch.from_numpy(idx.astype(np.float64))  # exact below 2**53
    packed[1, :val.size] = torch.from_numpy(val)
    gathered = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(gathered, packed)
    out_idx = np.concatenate([g[0, :s].cpu().numpy() for g, s in zip(gathered, sizes)])
    out_val = np.concatenate([g[1, :s].cpu().numpy() for g, s in zip(gathered, sizes)])
    return out_idx.astype(np.int64), out_val
