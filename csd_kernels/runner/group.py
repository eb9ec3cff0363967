"""The process group of a run: rank, world size and device under torchrun (or one plain process), the object
collectives the run needs, and a log file per rank."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .files import LOG_DIR

__all__ = ["Dist", "cpu_count", "rank_logger", "close_logger"]


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    active: bool = False  # a process group is in use
    owned: bool = False  # we created it (and destroy it)

    @classmethod
    def init(cls) -> "Dist":
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        if dist.is_available() and dist.is_initialized():  # a caller's process group
            local = int(os.environ.get("LOCAL_RANK", 0))
            device = torch.device("cuda", local) if cuda else torch.device("cpu")
            return cls(dist.get_rank(), dist.get_world_size(), local,
                       int(os.environ.get("LOCAL_WORLD_SIZE", 1)), device, True, False)
        if "WORLD_SIZE" in os.environ and "RANK" in os.environ:  # torchrun
            local = int(os.environ.get("LOCAL_RANK", 0))
            if cuda:
                torch.cuda.set_device(local)
            dist.init_process_group(backend="nccl" if cuda else "gloo")
            device = torch.device("cuda", local) if cuda else torch.device("cpu")
            return cls(dist.get_rank(), dist.get_world_size(), local,
                       int(os.environ.get("LOCAL_WORLD_SIZE", 1)), device, True, True)
        return cls(device=torch.device("cuda", 0) if cuda else torch.device("cpu"))

    def broadcast(self, obj):
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj) -> list:
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather(self, obj) -> Optional[list]:
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def close(self, finished: bool = False) -> None:
        """Destroys the process group we created. ``finished``: every rank got here after the same last collective,
        so they first wait for each other (a rank that tears gloo down while another still talks to it can abort in
        gloo's teardown); after a failure nobody waits (a dead rank would never arrive)."""
        if self.owned:
            import torch.distributed as dist

            if finished:
                dist.barrier()
            dist.destroy_process_group()
            self.owned = self.active = False


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_logger(out_dir: str, rank: int, quiet: bool) -> logging.Logger:
    os.makedirs(os.path.join(out_dir, LOG_DIR), exist_ok=True)
    log = logging.getLogger(f"csd_kernels.run.{os.getpid()}.rank{rank}")
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
    handler = _LogFile(os.path.join(out_dir, LOG_DIR, f"rank{rank}.log"))
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} pid {os.getpid()} %(levelname)s %(message)s"))
    log.addHandler(handler)
    return log


class _LogFile(logging.FileHandler):
    """A rank's log file that never prints a traceback when a line cannot be written (a full disk: the images the run
    writes next fail, and the command says so in one line); the line is lost."""

    def handleError(self, record) -> None:
        pass


def close_logger(log: logging.Logger) -> None:
    for handler in list(log.handlers):
        handler.close()
        log.removeHandler(handler)
