"""The dynamic shovels this node runs: started, restarted on a change, stopped.

`Shovels.reconcile(wanted)` is called by the server shell on every tick with the
shovel parameters this node must run ({(vhost, name): value}; empty on a node that
must run none): a shovel whose parameter appeared is started, one whose value
changed is stopped and started again, one whose parameter went is stopped. A
shovel that reached its src-delete-after stays, terminated, until its parameter
is cleared (it cleared it itself: the change is on its way). `status()` gives rabbitmqctl shovel_status's rows
of the shovels running here.
"""

from __future__ import annotations

import asyncio
import logging

from .parameters import ShovelError, check
from .worker import Shovel

log = logging.getLogger("quorumqueue.shovel")


class Shovels:
    def __init__(self, local_uri, on_finished, node_name: str) -> None:
        self.local_uri = local_uri
        self.on_finished = on_finished  # (vhost, name): clear the parameter
        self.node_name = node_name
        self.running: dict[tuple[str, str], Shovel] = {}
        self._stopping: set[asyncio.Task] = set()

    def reconcile(self, wanted: dict[tuple[str, str], dict]) -> None:
        for key, shovel in list(self.running.items()):
            if wanted.get(key) != shovel.value:
                del self.running[key]
                self._stop_later(shovel)
        for key, value in wanted.items():
            if key in self.running:
                continue
            try:
                definition = check(value, key[1])
            except ShovelError as error:  # checked when set: a value from elsewhere
                log.error("shovel '%s' in vhost '%s' not started: %s", key[1], key[0], error)
                continue
            shovel = Shovel(key[0], key[1], definition, value, self.local_uri,
                            self.on_finished, self.node_name)
            self.running[key] = shovel
            shovel.start()
            log.info("shovel '%s' in vhost '%s' started on this node", key[1], key[0])

    def _stop_later(self, shovel: Shovel) -> None:
        task = asyncio.get_running_loop().create_task(shovel.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def status(self) -> list[dict]:
        return [self.running[key].status() for key in sorted(self.running)]

    async def stop(self) -> None:
        shovels = list(self.running.values())
        self.running.clear()
        await asyncio.gather(*(s.stop() for s in shovels), *self._stopping,
                             return_exceptions=True)
