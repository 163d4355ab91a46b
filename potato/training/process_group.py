"""What a trainer needs to know about the other training processes of its run.

A run trains in one process, or data-parallel in one process per GPU (see
``potato/training/data_parallel.py``). The trainer's code is the same either
way: it asks its group to wrap the model, to agree at the end of every step on
the step's loss and on whether to stop, to share small results, and to say
which process writes the run's files. ``SingleProcess`` answers all of that
trivially; ``DataParallelGroup`` does it with ``torch.distributed``.

Why one vote per step rather than each process checking its own SIGTERM: a
cancel reaches the processes at slightly different moments, and a process
that stops before a step its peers have started leaves them waiting in that
step's gradient all-reduce. Summing ``[loss, stop]`` across processes once per
step makes every process stop at the same step, and gives rank 0 the global
loss for the progress events in the same collective. On CUDA the vote is read
two steps late, so reading it never stalls the GPU's queue of work.

Part of the remote half: importing this module loads only the standard
library; torch is imported when a group is built.
"""

from __future__ import annotations

from collections import deque
from typing import Any, List, Tuple

# How many steps late a CUDA process reads the stop vote (the CPU reads it at once).
CUDA_VOTE_LAG = 2


class SingleProcess:
    """The group of a run that trains in one process."""

    rank = 0
    size = 1
    is_main = True
    backend = None

    def wrap(self, model: Any) -> Any:
        return model

    def unwrap(self, model: Any) -> Any:
        return model

    def vote(self, loss_share: Any, stop: bool) -> Tuple[Any, bool]:
        """``(the step's loss, whether to stop)``; alone, both are this process's own."""
        return loss_share.detach(), stop

    def gather(self, obj: Any) -> List[Any]:
        return [obj]

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


class DataParallelGroup:
    """This process's place among a run's data-parallel training processes.

    Built inside a process that ``torch.distributed``'s launcher started (it
    reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` from
    the environment). ``backend`` is ``nccl`` on CUDA, ``gloo`` on the CPU.
    """

    def __init__(self, backend: str, device: str):
        import datetime

        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        kwargs = {"backend": backend, "timeout": datetime.timedelta(minutes=10)}
        if self.device.type == "cuda":
            kwargs["device_id"] = self.device  # binds NCCL to this GPU at once (torch >= 2.3)
        try:
            dist.init_process_group(**kwargs)
        except TypeError:  # an older torch without device_id
            kwargs.pop("device_id", None)
            dist.init_process_group(**kwargs)
        self.backend = backend
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.is_main = self.rank == 0
        self._lag = CUDA_VOTE_LAG if self.device.type == "cuda" else 0
        self._votes = deque()  # type: deque

    def wrap(self, model: Any) -> Any:
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        # An encoder's buffers (position ids) never change, so syncing them before every
        # forward would be a collective for nothing (the keyword was renamed in torch 2.13).
        accepted = inspect.signature(DistributedDataParallel.__init__).parameters
        no_sync = {"forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers": False}
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, **no_sync)

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)

    def vote(self, loss_share: Any, stop: bool) -> Tuple[Any, bool]:
        """Sum ``[loss_share, stop]`` over the processes; ``(global loss, whether to stop)``.

        Every process calls this once per step, so every process gets the same
        answer at the same step. The loss comes back as a tensor (no sync).
        """
        torch = self._torch
        ballot = torch.stack([loss_share.detach().float().reshape(()),
                              torch.tensor(1.0 if stop else 0.0, device=loss_share.device)])
        self._dist.all_reduce(ballot)
        self._votes.append(ballot)
        decided = False
        if len(self._votes) > self._lag:
            decided = bool(self._votes.popleft()[1].item() > 0)
        return ballot[0], decided

    def gather(self, obj: Any) -> List[Any]:
        """``obj`` from every process, in rank order (small, picklable things only)."""
        out = [None] * self.size  # type: List[Any]
        self._dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.backend == "nccl":
            self._dist.barrier(device_ids=[self.device.index])
        else:
            self._dist.barrier()

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
