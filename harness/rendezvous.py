"""DDP whose rendezvous has its own, shorter timeout than its collectives.

Every rank of a job starts within seconds of the others, so a rank that cannot reach the rendezvous
(``MASTER_ADDR:MASTER_PORT``) after minutes never will: a node name that does not resolve to the first node,
a port that another job holds, a rank that died loading its model. Left to the collectives' timeout
(``--ddp_timeout_minutes``, long enough for a slow step) such a job would wait that long in silence; here it
ends after ``--rendezvous_timeout_minutes`` with one line naming the address.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy


class RendezvousError(RuntimeError):
    """The ranks did not meet in time."""


class RendezvousDDP(DDPStrategy):
    """``DDPStrategy`` whose process group is set up within ``rendezvous_timeout``, then given ``timeout`` (the
    collectives' bound)."""

    def __init__(self, *args, rendezvous_timeout: timedelta = timedelta(minutes=5), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rendezvous_timeout = rendezvous_timeout

    def setup_distributed(self) -> None:
        collectives = self._timeout
        self._timeout = self.rendezvous_timeout
        try:
            super().setup_distributed()
        except dist.DistError as err:
            address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
            raise RendezvousError(
                f"rank {self.global_rank} of {self.world_size}: no rendezvous with the other ranks at {address} within "
                f"{self.rendezvous_timeout.total_seconds():.0f} s (--rendezvous_timeout_minutes); check that this "
                f"address reaches the first node and that the port is free ({type(err).__name__})") from None
        finally:
            self._timeout = collectives
        if collectives is not None and collectives != self.rendezvous_timeout:
            dist.distributed_c10d._set_pg_timeout(collectives)
