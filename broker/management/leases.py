"""The management API's leases: the Spark connector's durable leases as operator
objects (docs/behaviour/leases.md).

Endpoints (quorumqueue's own; RabbitMQ has no leases), each the management operation
of node/leases.py run as the HTTP user, administrator tag required:
- `GET /api/leases`, `GET /api/leases/V`, `GET /api/leases/V/QUEUE`: one row per lease
  (node/leases.lease_row: vhost, queue, lease, state holding|empty|fenced, messages,
  message_bytes, first, end, timeout_ms, idle_ms, expires_in_ms, fence);
- `DELETE /api/leases/V/QUEUE/LEASE`: an operator's release: the lease's unsettled
  messages go back to the queue (delivery count + 1) and a lease that held some is
  fenced, so the query that held it fails at its next start saying so instead of
  settling nothing or reading its batch twice -> `{"released": n}`.

Not here: the leases themselves (fifo/leases.py), the web UI's page (ui/).
"""

from __future__ import annotations

from .access import require
from .app import Request, route
from .changes import operation


@route("GET", "/api/leases")
async def all_leases(request: Request):
    require(request.user, "administrator")
    return await operation(request, "lease.list")


@route("GET", "/api/leases/{vhost}")
async def vhost_leases(request: Request):
    require(request.user, "administrator")
    return await operation(request, "lease.list", vhost=request.captures["vhost"])


@route("GET", "/api/leases/{vhost}/{queue}")
async def queue_leases(request: Request):
    require(request.user, "administrator")
    return await operation(request, "lease.list", vhost=request.captures["vhost"],
                           queue=request.captures["queue"])


@route("DELETE", "/api/leases/{vhost}/{queue}/{lease}")
async def release_lease(request: Request):
    require(request.user, "administrator")
    where = {"vhost": request.captures["vhost"], "queue": request.captures["queue"],
             "lease": request.captures["lease"]}
    await operation(request, "lease.info", **where)  # 404 for a lease not there
    return await operation(request, "lease.release", **where, fence=True)
