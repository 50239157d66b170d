"""The few collectives a folder publish needs (broadcast, all_gather); trivial for one process."""

from __future__ import annotations

from typing import Any, List


class Comm:
    """The few collectives a folder publish needs; trivial for one process."""

    def __init__(self, rank: int, world_size: int, group: Any):
        self.rank, self.world_size, self.group = rank, world_size, group
        self.dist = None
        if world_size > 1:
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_initialized():
                raise ValueError(f"world_size={world_size} needs an initialised torch.distributed process group "
                                 "(dist.init_process_group) or group=")
            self.dist = dist
            self.src = dist.get_global_rank(group, 0) if group is not None else 0

    def broadcast(self, obj: Any) -> Any:
        if self.dist is None:
            return obj
        box = [obj if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=self.src, group=self.group)
        return box[0]

    def all_gather(self, obj: Any) -> List[Any]:
        if self.dist is None:
            return [obj]
        out: List[Any] = [None] * self.world_size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out
