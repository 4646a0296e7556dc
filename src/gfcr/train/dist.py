"""Data-parallel training across processes (``torchrun``): who does what, and the collectives used.

Launch ``torchrun --nproc_per_node N -m gfcr.cli train CONFIG`` (or any launcher that sets
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; ``LOCAL_RANK`` picks the GPU). Every
rank runs the same loop on the same data:

* **generate**: each rank samples its share of the step's prompts (``prompts[rank::world]``) with
  its own engine; the rollouts are gathered to every rank, in the original prompt order. Seeds are
  per prompt, so which rank samples a prompt does not change its seeds.
* **verify, signals, control, replay**: run identically on every rank over the gathered rollouts,
  so selectors, buffers and advantages stay in step without being sent around.
* **update**: each rank runs forward/backward on its share of each mini-batch's rows with the
  mini-batch's global denominators; gradients are summed over ranks (``all_reduce``) before the
  clip and the optimizer step, so every rank takes the same step and the weights stay identical
  (the same update a single process would make, up to float summation order).
* **writes**: only rank 0 writes the store, checkpoints, metrics and the run folder; the others
  read them.

Single-process runs (no ``WORLD_SIZE``, or 1) never touch ``torch.distributed``. Collectives time
out after ``GFCR_DIST_TIMEOUT_S`` seconds (default 7200: rank 0 may evaluate alone for a while).
"""

from __future__ import annotations

import datetime
import os
from typing import Any


def world() -> int:
    """Number of processes (1 unless ``torch.distributed`` is initialised)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def init_from_env(device: str) -> str:
    """Join the process group when launched with ``WORLD_SIZE > 1``; returns the device this rank
    uses (``cuda`` becomes ``cuda:LOCAL_RANK``). Backend: nccl on CUDA, gloo on CPU."""
    import torch
    import torch.distributed as dist

    n = int(os.environ.get("WORLD_SIZE", "1"))
    if n <= 1:
        return device
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    if device.startswith("cuda") and ":" not in device:
        device = f"cuda:{local}"
    if not dist.is_initialized():
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        # generous: rank 0 evaluates and checkpoints alone while the others wait in a barrier
        timeout = datetime.timedelta(seconds=float(os.environ.get("GFCR_DIST_TIMEOUT_S", "7200")))
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo", timeout=timeout)
    return device


def barrier() -> None:
    if world() > 1:
        import torch.distributed as dist

        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects)."""
    if world() == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (picklable objects)."""
    if world() == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def shard(items: list[Any]) -> list[Any]:
    """This rank's share: ``items[rank::world]``."""
    return items[rank()::world()]


def unshard(parts: list[list[Any]]) -> list[Any]:
    """Inverse of :func:`shard` given every rank's share in rank order: the original order.

    Example: world 2, items [a, b, c] → shares [[a, c], [b]] → [a, b, c].
    """
    n = sum(len(p) for p in parts)
    out: list[Any] = [None] * n
    for r, p in enumerate(parts):
        for j, x in enumerate(p):
            out[r + j * len(parts)] = x
    return out


def all_reduce_grads(params: list[Any]) -> None:
    """Sum the gradients of ``params`` over ranks (a rank without a gradient contributes zeros)."""
    if world() == 1:
        return
    import torch
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def all_reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Sum a dict of floats over ranks (same keys on every rank)."""
    if world() == 1:
        return values
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist(), strict=True))
