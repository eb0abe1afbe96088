"""The asyncio shell around the pure node: sockets, timers, group commit, alarms.

How it works: each TCP connection is an asyncio.Protocol feeding its Session.
Input handling only schedules a flush for the end of the event-loop iteration. So
all the data that arrived together is applied first. Then it is persisted with one
fsync (group commit), before any reply or confirm leaves. The fsyncs run on one
writer thread (`flush`: one Sync of node/group_commit.py at a time). While the disk
syncs, the loop goes on reading and applying input. The output of that input waits
for the next Sync.

Timers: a ticker, twice a second, drives heartbeats, queue expiry and the memory
and disk alarm checks (`_tick_forever`). A Raft ticker, every
`raft.tick_interval_ms` (100 ms), drives elections and heartbeats
(`_raft_tick_forever`). A sampler notes how late the loop runs its timers
(loop_lag.py: the Prometheus endpoint's lag histogram).

Flow control: the input read while a Sync runs is the next round. A round handles
at most `flow_control.round_methods` client methods (`receive`). Past that, a
client's bytes wait in its session. Its socket is not read until a new round
begins (`_new_round`, when `flush` takes the round into a Sync). Handling client
input takes at most half a Raft tick of wall time (`_spent`, `_refill_slice`). Then
the loop runs its timers and other callbacks. So one loop iteration never holds more
than a round's work. Nor does it run long on a machine short of CPU. The Raft ticks
and heartbeats keep their pace.

A full disk is an alarm, not an exit (`_stall`). A Sync that finds no room (ENOSPC,
EDQUOT) has undone its writes. The shell keeps it, with the output waiting for it.
It raises the disk alarm: publishers are blocked, as RabbitMQ's. It gives back the
disk reserve and runs the same Sync again. That is at once if the reserve freed
space, else every half second, until it succeeds (disk.py). Nothing it covers was
confirmed. Nothing else is written meanwhile: no other Sync begins. Input is still
read and applied. Heartbeats, connection.blocked and handshakes go out
(`_send_urgent`).

Invariants:
- Session output is sent only after the Sync that began after it was written has
  ended. (Or at once, when nothing was pending to write.) So nothing leaves before
  the fsync that persists what it acknowledges.
- Raft messages go to peers from `end_sync`, after the fsync of their Ready.
- At most one Sync runs.
- The shell holds no protocol state of its own.
- A session with held input (`Session.input_held`) is not read until its input is
  handled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from typing import Callable

from ..amqp import spec
from ..auth.users import UserStore
from ..cluster.outbox import ADD_PEER, SEND
from ..config import Settings, cluster_tls_contexts, ssl_listener_context
from ..groups.driver import MAX_ROUNDS
from ..metrics.http import MetricsListener
from ..metrics.loop_lag import LoopLag
from ..node import group_commit, handover, membership
from ..node.node import Node
from ..node.session import Session
from ..node.shell import NO_SHELL, Shell
from ..raft.storage import LogStore
from ..raft.storage.errors import is_disk_full
from ..shovel.supervisor import Shovels
from ..shovel.worker import local_uri
from ..storage.message_store import MessageStore
from ..storage.metadata_store import MetadataStore
from . import handover_link
from .boot import catch_up_metadata
from .cluster_transport import ClusterTransport
from .disk import DiskWatch
from .loop_lag import LagSampler
from .loopback_transport import LoopbackTransport
from .periodic import Steps
from .sockets import SocketLimit

log = logging.getLogger("quorumqueue.broker")


_STATM_FD: int | None = None  # /proc/self/statm, kept open: read under EMFILE too


def resident_memory_bytes() -> int:
    """The process's resident set size (RabbitMQ's `rss` strategy). The file stays
    open, so the memory alarm still reads it while every other descriptor is taken."""
    global _STATM_FD
    if _STATM_FD is None:
        _STATM_FD = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    return int(os.pread(_STATM_FD, 256, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")


def total_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def build_node(settings: Settings, shell: Shell) -> Node:
    """A node over `settings.data_dir`, with durable state recovered, run by `shell`."""
    os.makedirs(settings.data_dir, exist_ok=True)
    loopback = frozenset(settings.loopback_users)
    if settings.default_user == "guest":
        users = UserStore.with_default_user(loopback)
    else:
        users = UserStore(loopback_users=loopback)
        users.add(settings.default_user, settings.default_pass, ("administrator",),
                  {settings.default_vhost})
    store = MessageStore(os.path.join(settings.data_dir, "msgstore"),
                         settings.msg_store_segment_bytes, settings.fsync)
    # snapshots and segment deletions go with the next Sync, off the event loop
    log_store = LogStore(settings.data_dir, settings.storage_config(), background=True)
    node = assemble_node(settings, users, log_store, store, MetadataStore(settings.data_dir),
                         shell)
    counts = node.recover()
    node.cluster.meta.recover()  # the metadata group's snapshot, if the file is older
    if settings.default_vhost not in node.vhosts:
        from ..node.vhost import VHost

        node.vhosts[settings.default_vhost] = VHost(settings.default_vhost)
        node.metadata_dirty = True
    log.info("recovered %d durable queues with %d messages from %s", counts["queues"],
             counts["messages"], settings.data_dir)
    return node


def assemble_node(settings: Settings, users: UserStore, log_store: LogStore,
                  message_store: MessageStore | None = None,
                  metadata_store: MetadataStore | None = None,
                  shell: Shell = NO_SHELL) -> Node:
    """A node and what it always runs, whatever the cluster's size: its quorum groups
    over `log_store` and its member of the metadata group (a node is a cluster of
    one until others join: every definition takes the same path). `shell`: the
    server running it (node/shell.py), none for a node driven directly."""
    return Node(settings, users, log_store, message_store, metadata_store, shell)


def cluster_cookie(settings: Settings) -> str:
    """The secret nodes of one cluster share. It is `cluster.cookie`, else the
    contents of ~/.quorumqueue.cookie. That file is created with a random secret if
    missing, like Erlang's ~/.erlang.cookie. So nodes of one user on one host agree
    without configuration.

    Nodes started at once race to create the file. Each writes its secret to a file
    of its own and links it into place. The link is atomic, and refused if the file
    exists. So there is one winner. Every node reads the winner's whole secret, never
    a partly written or empty file."""
    if settings.cluster_cookie:
        return settings.cluster_cookie
    path = os.path.expanduser("~/.quorumqueue.cookie")
    if not os.path.exists(path):
        import secrets

        mine = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(24) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(mine, path)
            except FileExistsError:  # another node of this host won: use its secret
                pass
        finally:
            os.unlink(mine)
    with open(path) as handle:
        cookie = handle.read().strip()
    if not cookie:
        from ..config import ConfigError

        raise ConfigError(f"the cluster cookie file {path} is empty: delete it (a new "
                         "secret is made at the next start) or set cluster.cookie in "
                         "the configuration")
    return cookie


def now_ms() -> int:
    """Wall-clock milliseconds: the leader time timed commands carry (lease expiry)."""
    return int(time.time() * 1000)


def pass_time(node: Node) -> float:
    """Tell the node the time (it reads no clock itself); returns monotonic seconds."""
    now = time.monotonic()
    node.set_clock(now, int(time.time() * 1000))
    return now


# the fault suite's slow disk (tests/faults): when this environment variable names a
# file, each Sync first waits the seconds written in it (none while it is missing)
FAULT_FSYNC_DELAY_FILE = "QUORUMQUEUE_FAULT_FSYNC_DELAY_FILE"
# seconds a connection to be handed to another worker may wait for its output to be
# sent (a slow client); past it, and for a worker's metadata to catch up, it stays
HANDOVER_WAIT_S = 10.0
# seconds a closed connection's socket waits, its last frames sent and its write side
# shut, for the client to close its side (`_close_after_output`)
CLOSE_DRAIN_SECONDS = 5.0


def _fault_delay(path: str) -> float:
    try:
        with open(path) as handle:
            return max(0.0, float(handle.read().strip() or 0))
    except (OSError, ValueError):
        return 0.0


class SyncWriter:
    """The thread that runs Syncs (the fsyncs), one at a time, off the event loop.
    Each Sync's outcome (None or the exception) comes back on the loop through
    `done`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slow_disk = os.environ.get(FAULT_FSYNC_DELAY_FILE)
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="quorumqueue-sync",
                                        daemon=True)
        self._thread.start()

    def submit(self, sync: group_commit.Sync, done) -> None:
        self._work.put((sync, done))

    def stop(self) -> None:
        self._work.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            sync, done = item
            if self._slow_disk:
                time.sleep(_fault_delay(self._slow_disk))
            try:
                sync.run()
            except BaseException as error:  # reported on the loop, which stops the node
                self._loop.call_soon_threadsafe(done, error)
            else:
                self._loop.call_soon_threadsafe(done, None)


class _Connection(asyncio.Protocol):
    __slots__ = ("server", "transport", "session", "peer", "write_paused", "handed")

    def __init__(self, server: "BrokerServer", adopted: Session | None = None) -> None:
        """`adopted`: the session of a connection another worker handed over."""
        self.server = server
        self.transport = None
        self.session: Session | None = adopted
        self.write_paused = False   # the socket's buffer is full: pull no stream output
        self.handed = False   # handed over to another worker: it is that one's now

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.peer = f"{peer[0]}:{peer[1]}"
        if self.session is not None:  # adopted: accepted, logged and counted by worker 0
            self.server.connections[self.session] = self
            log.info("adopted AMQP connection %s", self.peer)
            return
        local = transport.get_extra_info("sockname") or ("?", 0)
        self.session = Session(self.server.node, peer[0], time.monotonic(),
                               peer=f"{self.peer} -> {local[0]}:{local[1]}")
        tls = transport.get_extra_info("ssl_object")
        if tls is not None:  # the TLS listener: the handshake is done
            self.session.ssl_protocol = tls.version()
            self.session.ssl_cipher = (tls.cipher() or (None,))[0]
        self.server.node.counters.connections_opened += 1
        self.server.connections[self.session] = self
        log.info("accepting AMQP connection %s%s", self.peer,
                 f" over {self.session.ssl_protocol} ({self.session.ssl_cipher})"
                 if self.session.ssl_protocol else "")

    def data_received(self, data: bytes) -> None:
        self.server.receive(self, data)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.session.streaming:
            self.server.node.dirty.add(self.session)
            self.server.schedule_flush()

    def connection_lost(self, exc) -> None:
        if self.handed:
            return
        session = self.session
        if not session.closed:
            log.warning("client unexpectedly closed TCP connection %s", self.peer)
        session.connection_lost()
        self.server.node.counters.connections_closed += 1
        self.server.connections.pop(session, None)
        self.server.held_input.pop(session, None)
        self.server.schedule_flush()


class BrokerServer:
    def __init__(self, settings: Settings,
                 on_fatal: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.node = build_node(settings, self)  # the node's shell (node/shell.py): this
        self.connections: dict[Session, _Connection] = {}
        self._lingering: set = set()  # early refusals and draining closes, closed later
        self._flush_scheduled = False
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.Task | None = None
        self.port = settings.port
        self.ssl_port: int | None = None   # the TLS listener's bound port, if any
        self._ssl_server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._raft_ticker: asyncio.Task | None = None
        # called instead of raising when a flush fails (run.py); None: raise
        self.on_fatal = on_fatal
        self._writer: SyncWriter | None = None  # the thread that runs Syncs (`flush`)
        self._sync: group_commit.Sync | None = None  # running on the writer thread
        # output written while a Sync ran: sent after the next Sync (session, bytes, closed)
        self._held: list[tuple[Session, list, bool]] = []
        self._stopped = False
        # the cluster's transport (`_cluster_transport`), once `start` started it
        self.cluster_transport = None
        self._cluster_started = False
        # flow control: the client input this round may still take (methods), and the
        # sessions whose input waits for the next round, in the order they are served
        self._round_left = settings.flow_round_methods
        # ... and the wall time handling client input may still take before the loop
        # runs its timers and other callbacks: half a Raft tick per slice, so that on
        # a machine short of CPU (where each method takes longer) the ticks and
        # heartbeats still keep their pace
        self._slice = settings.raft_tick_ms / 2000
        self._slice_left = self._slice
        self._slice_refill_scheduled = False
        self.held_input: dict[Session, _Connection] = {}
        self._held_scheduled = False
        # output sent once the running Sync ends (`_flush`): a handover waits for it
        self._sync_output: list[tuple[Session, list, bool]] = []
        # workers (node/handover.py): worker 0's links to the others by name, the
        # sessions being handed over; another worker's link from worker 0
        self.handover_links = handover_link.links_from_env(os.environ)
        self._handovers: set[Session] = set()
        self.management = None  # the management HTTP API, once started (start_management)
        self.metrics: MetricsListener | None = None  # the Prometheus endpoint
        self.shovels: Shovels | None = None  # the dynamic shovels run here (start)
        # the data directory's file system: full disks, the reserve (disk.py)
        self.disk = DiskWatch(settings.data_dir, settings.disk_reserve_bytes)
        self._retry: asyncio.TimerHandle | None = None   # a held Sync's next run (`_stall`)
        # (wall-clock ms, its timer): the node's next queue deadline (`_arm_deadline`)
        self._deadline: tuple[int, asyncio.TimerHandle] | None = None
        # the descriptors client sockets may hold, of RLIMIT_NOFILE (sockets.py): every
        # listener's accepted sockets count; the rest is the node's own
        self.sockets = SocketLimit()
        # how late the loop runs its timers: the Prometheus endpoint's lag histogram
        self.loop_lag = LoopLag()
        self._lag_sampler = LagSampler(self.loop_lag)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._lag_sampler.start(self._loop)
        self._writer = SyncWriter(self._loop)
        self.node.flush()  # persist recovery results (e.g. a created default vhost)
        # as RabbitMQ's resource monitors: alarms hold before the first client connects
        total = self.settings.total_memory(total_memory_bytes())
        memory_limit = self.memory_limit()
        log.info("Memory high watermark set to %d MiB (%d bytes) of %d MiB (%d bytes) total",
                 memory_limit // 2 ** 20, memory_limit, total // 2 ** 20, total)
        log.info("Disk free limit set to %dMB", self.disk_free_limit() // 1_000_000)
        self.disk.start()
        self.check_alarms()
        # accepts failing for want of descriptors: a line every 10 s, not a traceback each
        self._loop.set_exception_handler(self.sockets.loop_exception_handler)
        log.info("file descriptors: %d; client sockets may take %d (sockets_limit), the "
                 "rest is kept for the node's files", self.sockets.descriptors,
                 self.sockets.limit)
        self._server = await self._loop.create_server(
            self.sockets.guard(lambda: _Connection(self), "AMQP"),
            self.settings.host, self.settings.port,
            reuse_address=True, backlog=1024, start_serving=False)  # see the end
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = asyncio.create_task(self._tick_forever())
        log.info("started TCP listener on %s:%d", self.settings.host, self.port)
        context = ssl_listener_context(self.settings)
        if context is not None:  # AMQP over TLS: the same protocol, another listener
            host = self.settings.ssl_host or self.settings.host
            self._ssl_server = await self._loop.create_server(
                self.sockets.guard(lambda: _Connection(self), "AMQP TLS"), host,
                self.settings.ssl_port, ssl=context,
                reuse_address=True, backlog=1024,
                ssl_handshake_timeout=self.settings.network.ssl_handshake_timeout_ms / 1000,
                start_serving=False)
            self.ssl_port = self._ssl_server.sockets[0].getsockname()[1]
            log.info("started TLS (SSL) listener on %s:%d", host, self.ssl_port)
        self.metrics = MetricsListener(self)
        try:
            await self.metrics.start()
        except BaseException:
            self._server.close()
            if self._ssl_server is not None:
                self._ssl_server.close()
            self._ticker.cancel()
            self._writer.stop()
            raise
        cluster = self.node.cluster
        # where clients reach this node, without credentials (cluster status)
        cluster.amqp_uri = f"amqp://{self.settings.host}:{self.port}"
        self._raft_ticker = asyncio.create_task(self._raft_tick_forever())
        self.shovels = Shovels(local_uri(self.settings.default_user, self.settings.default_pass,
                                         self.settings.host, self.port),
                               self._shovel_finished, cluster.name)
        self.cluster_transport = self._cluster_transport()
        await self.cluster_transport.start()
        self._cluster_started = True
        self._send_cluster_output()  # what the cluster queued while the node started
        # clients once this node applied what the metadata group committed while it was
        # down, as RabbitMQ 3.x serves once its tables are loaded (boot.py)
        await catch_up_metadata(self)
        if not handover.enabled(self.settings):
            for link in self.handover_links.values():
                self._receive_handovers(link)
        await self._server.start_serving()
        if self._ssl_server is not None:
            await self._ssl_server.start_serving()

    def _cluster_transport(self):
        """What carries the cluster's output (cluster/outbox.py): the inter-node
        listener and connections of a node with cluster configuration, else the
        loopback transport of a node alone (no peer, nothing leaves)."""
        cluster = self.node.cluster
        if not self.settings.clustered:
            return LoopbackTransport()
        host, port = cluster.addresses[cluster.name]
        peers = {n: a for n, a in cluster.addresses.items() if n != cluster.name}

        def on_message(sender: str, envelope, node=self.node) -> None:
            pass_time(node)  # what a peer forwards (a publish) sees the time now
            cluster.on_message(sender, envelope)
            self.schedule_flush()  # its answers, and what it made committed, go out

        ssl_server, ssl_client = cluster_tls_contexts(self.settings)
        transport = ClusterTransport(
            cluster.name, self.settings.cluster_name, cluster_cookie(self.settings),
            host, port, peers, on_message, self._cluster_link_lost,
            ssl_server=ssl_server, ssl_client=ssl_client, guard=self.sockets.guard)
        log.info("cluster %s: node %s, inter-node listener on %s:%d%s, peers %s",
                 self.settings.cluster_name, cluster.name, host, port,
                 " (TLS)" if ssl_server is not None else "",
                 ", ".join(sorted(peers)) or "none")
        return transport

    def _cluster_link_lost(self, name: str) -> None:
        pass_time(self.node)
        self.node.cluster.link_lost(name)
        self.schedule_flush()  # what the answered requests' callers send now

    def _send_cluster_output(self) -> None:
        """What the cluster queued for other nodes (Cluster.data_to_send), handed to the
        transport in order; kept in the outbox until the transport has started."""
        if not self._cluster_started:
            return
        transport = self.cluster_transport
        for kind, name, item in self.node.cluster.data_to_send():
            if kind == SEND:
                try:
                    transport.send(name, item)
                except KeyError:  # a member whose address this node has not learned yet
                    log.debug("no address for %s yet: dropped a message to it", name)
            elif kind == ADD_PEER:
                transport.add_peer(name, item)
            else:
                transport.remove_peer(name)

    async def start_management(self) -> None:
        """The management HTTP API on this loop (broker/management/), on
        management.tcp.ip:management.tcp.port."""
        from ..management.app import ManagementAPI

        management = ManagementAPI(self)
        await management.start()
        self.management = management

    # what the management API asks of its shell (management/app.py)

    def pass_time(self) -> float:
        return pass_time(self.node)

    def attach_direct(self, session: Session, link) -> None:
        """A direct connection (management/direct.py): its session's output goes to
        `link.transport` after each group commit, as a socket's does."""
        self.connections[session] = link

    def detach_direct(self, session: Session) -> None:
        if self.connections.pop(session, None) is not None and not session.closed:
            session.connection_lost()
        self.schedule_flush()

    def client_connections(self):
        """(session, (peer host, port), (local host, port)) of every AMQP client
        connection over a socket (direct connections are left out)."""
        for session, connection in list(self.connections.items()):
            if not isinstance(connection, _Connection):  # (registered once connected)
                continue
            peer = connection.transport.get_extra_info("peername") or ("?", 0)
            local = connection.transport.get_extra_info("sockname") or ("?", 0)
            yield session, (peer[0], peer[1]), (local[0], local[1])

    def shovel_rows(self) -> list:
        """The status rows of the dynamic shovels run here (none before `start`)."""
        return list(self.shovels.status()) if self.shovels is not None else []

    def client_rows(self) -> dict:
        """The management rows of this node's AMQP clients (management/rows.py)."""
        from ..management.rows import client_rows

        return client_rows(self.node, self.client_connections())

    def close_client(self, name: str, reason: str) -> bool:
        """Close the client connection named `name` (its management name, "peer ->
        local") with 320 CONNECTION_FORCED and `reason`; False if there is none."""
        for session, peer, local in self.client_connections():
            if f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}" == name:
                session.server_close(spec.CONNECTION_FORCED, reason, time.monotonic())
                self.node.dirty.add(session)
                self.schedule_flush()
                return True
        return False

    def memory_used(self) -> int:
        return resident_memory_bytes()

    async def stop(self) -> None:
        """Close client connections with 320 CONNECTION_FORCED, persist, stop."""
        if self.shovels is not None:
            await self.shovels.stop()
        self.node.cluster.mirrors.stopping()  # ha-promote-on-shutdown applies
        if self.management is not None:
            await self.management.stop()
        if self._server is not None:
            self._server.close()
        if self._ssl_server is not None:
            self._ssl_server.close()
        if self.metrics is not None:
            await self.metrics.stop()
        now = time.monotonic()
        for session in list(self.connections):
            session.server_close(spec.CONNECTION_FORCED,
                                 "broker forced connection closure with reason 'shutdown'", now)
        self.flush()
        deadline = time.monotonic() + 2.0
        while any(not s.closed for s in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.wait_synced()  # the close-oks it holds go out before the sockets close
        for connection in list(self.connections.values()):
            connection.transport.close()
        for transport in list(self._lingering):
            self._close_lingering(transport)
        if self._ticker is not None:
            self._ticker.cancel()
        if self._raft_ticker is not None:
            self._raft_ticker.cancel()
        self._lag_sampler.stop()
        await self.wait_synced()
        self._stopped = True  # a flush still scheduled finds the stores closed: none
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._deadline is not None:
            self._deadline[1].cancel()
            self._deadline = None
        try:
            self.node.flush()
        except OSError as error:
            if not is_disk_full(error):
                raise
            log.warning("stopping with the disk full: what was not confirmed is not "
                        "written (%s)", error)
        self._writer.stop()
        if self._cluster_started:
            await self.cluster_transport.stop()
        if self.node.store is not None:
            self.node.store.close()
        self.node.quorum.store.close()
        log.info("stopped")

    # ------------------------------------------------------------ client input

    def receive(self, connection: _Connection, data: bytes) -> None:
        """A client's bytes, handled while this round's budget lasts
        (`flow_control.round_methods`). Past it they wait in the session. The socket
        is not read until a round is taken into a Sync (`flush`)."""
        session = connection.session
        began = pass_time(self.node)
        budget = self._round_left if self._slice_left > 0 else 0
        handled = session.receive_data(data, began, budget)
        self._round_left -= handled
        self._spent(began)
        if session.handing_over is not None:
            self._begin_handover(connection)
        elif session.input_held and not session.closed and session not in self.held_input:
            self.held_input[session] = connection
            connection.transport.pause_reading()
        self.node.dirty.add(session)
        self.schedule_flush()

    def _take_held_input(self) -> None:
        """A new round: the held sessions' input, oldest held first, while the
        budget lasts; a session whose input is all handled is read again."""
        self._held_scheduled = False
        if self._stopped:
            return
        began = pass_time(self.node)
        for session, connection in list(self.held_input.items()):
            if self._round_left <= 0 or self._slice_left <= 0:
                break
            del self.held_input[session]
            self._round_left -= session.take_input(self._round_left)
            began = self._spent(began)
            self.node.dirty.add(session)
            if session.closed or session not in self.connections:
                continue
            if session.handing_over is not None:
                self._begin_handover(connection)
                continue
            if session.input_held:
                self.held_input[session] = connection   # served again after the others
            elif not session.paused:
                connection.transport.resume_reading()
        self.schedule_flush()

    def _spent(self, began: float) -> float:
        """Count the time since `began` against this slice; the next loop iteration
        refills it. Returns now."""
        now = time.monotonic()
        self._slice_left -= now - began
        if not self._slice_refill_scheduled:
            self._slice_refill_scheduled = True
            self._loop.call_soon(self._refill_slice)
        return now

    def _refill_slice(self) -> None:
        """A new loop iteration (timers ran meanwhile): a whole slice again, and the
        held input taken while this round's budget lasts."""
        self._slice_refill_scheduled = False
        self._slice_left = self._slice
        if self.held_input and self._round_left > 0:
            self._take_held_input()

    def _new_round(self) -> None:
        """The input so far is in a Sync (or needs none): the budget is whole again."""
        self._round_left = self.settings.flow_round_methods
        if self.held_input and not self._held_scheduled:
            self._held_scheduled = True
            self._loop.call_soon(self._take_held_input)

    # ------------------------------------------------------------ handover (workers)

    def _begin_handover(self, connection: _Connection) -> None:
        """The session waits to be handed to another worker (node/handover.py): read
        no more of it, and hand it over once its output is sent (`_hand_over`)."""
        session = connection.session
        if session in self._handovers:
            return
        self._handovers.add(session)
        self.held_input.pop(session, None)
        connection.transport.pause_reading()
        self._loop.create_task(self._hand_over(connection))

    def _output_pending(self, session: Session, connection: _Connection) -> bool:
        if session.connection.outbound or session.connection.urgent or session.streaming:
            return True
        for waiting in (self._held, self._sync_output):
            if any(item[0] is session and item[1] for item in waiting):
                return True
        return connection.transport.get_write_buffer_size() > 0

    async def _hand_over(self, connection: _Connection) -> None:
        """Once what the session wrote is sent: its socket, state and unread bytes to
        its worker (handover_link.py); the session ends here. A worker with no link,
        or output still unsent after HANDOVER_WAIT_S, keeps it here."""
        session = connection.session
        target = session.handing_over
        link = self.handover_links.get(target)
        deadline = time.monotonic() + HANDOVER_WAIT_S
        try:
            while link is not None and session.handing_over == target and (
                    self._output_pending(session, connection)):
                if time.monotonic() > deadline:
                    link = None
                    break
                self.schedule_flush()
                await asyncio.sleep(0.001)
            if session.closed or session.handing_over != target:
                return  # the client went meanwhile: its input was handled here
            if link is None:
                log.warning("AMQP connection %s stays on this worker: no handover to %s",
                            connection.peer, target)
                session.stay()
                self.held_input[session] = connection
                self._loop.call_soon(self._take_held_input)
                return
            state = handover.capture(session, self.node.cluster.meta.raft.applied_index)
            sock = connection.transport.get_extra_info("socket")
            try:
                handover_link.send(link, state, session.connection.unread(), sock.fileno())
            except OSError as error:
                log.error("closing AMQP connection %s: its handover to %s failed: %s",
                          connection.peer, target, error)
                session.connection_lost()
                connection.transport.abort()
                return
        finally:
            self._handovers.discard(session)
        session.handed_over(target)
        connection.handed = True
        self.connections.pop(session, None)
        self.held_input.pop(session, None)
        connection.transport.abort()  # this process's descriptor only: the socket lives on
        log.info("AMQP connection %s handed over to %s", connection.peer, target)

    def _receive_handovers(self, link) -> None:
        receiver = handover_link.Receiver(link, self._adopt)

        def readable() -> None:
            if not receiver.readable():
                self._loop.remove_reader(link.fileno())

        self._loop.add_reader(link.fileno(), readable)

    def _adopt(self, state: dict, unread: bytes, sock) -> None:
        self._loop.create_task(self._adopt_when_applied(state, unread, sock))

    async def _adopt_when_applied(self, state: dict, unread: bytes, sock) -> None:
        """Serve a connection handed over, once this worker applied the metadata the
        sender had (a queue it declared a moment ago), HANDOVER_WAIT_S at most."""
        raft = self.node.cluster.meta.raft
        deadline = time.monotonic() + HANDOVER_WAIT_S
        while raft.applied_index < state["metadata_index"] and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        try:
            session = handover.adopt(self.node, state, unread, pass_time(self.node))
        except handover.AdoptError as error:
            log.error("closing AMQP connection %s handed over: %s", state["peer"], error)
            sock.close()
            return
        sock.setblocking(False)
        _transport, connection = await self._loop.connect_accepted_socket(
            lambda: _Connection(self, session), sock)
        self.receive(connection, b"")

    # ------------------------------------------------------------ flushing

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Group commit without blocking the loop. Take everything pending as one
        Sync (node/group_commit.py), and every session's output so far. Fsync on the
        writer thread. Send that output once the Sync is durable. Meanwhile input is
        read and applied; its output waits for the next Sync. A step with nothing to
        write finishes (and sends) at once. Then the node's next deadline gets its
        timer."""
        self._flush_scheduled = False
        self._flush()
        self._arm_deadline()

    def _flush(self) -> None:
        self._send_cluster_output()  # whether or not a Sync runs: peers wait on it
        if self._sync is not None or self._stopped:
            return  # the running Sync flushes again when it ends
        node = self.node
        pass_time(node)  # deliveries made while applying are stamped now (consumer timeout)
        try:
            for _round in range(MAX_ROUNDS):
                sync = group_commit.begin_sync(node)
                if sync.writes:
                    break
                group_commit.end_sync(node, sync)  # nothing to wait for
                if not sync.round.readies:
                    sync = None
                    break
            else:  # pragma: no cover - proposals while applying are bounded
                log.warning("flush: still busy after %d rounds", MAX_ROUNDS)
                sync = None
        except Exception:
            self._fatal()
            return
        self._send_cluster_output()  # the leaders' appends leave while this Sync runs
        self._new_round()
        output, self._held = self._held + self._take_output(), []
        if sync is None:
            self._send(output)
            return
        self._sync = sync
        self._sync_output = output
        self._writer.submit(sync, lambda error: self._synced(sync, output, error))

    def _synced(self, sync, output, error: BaseException | None) -> None:
        """The writer thread finished `sync`. Send the output that waited for it.
        Then release what it covers (`end_sync`) and flush again. Output written while
        it ran may depend on writes it did not cover: it is held for the next Sync.
        What `end_sync` releases depends only on this Sync and earlier ones. That is
        confirms by batch id, replies to applied entries. So it leaves now, with two
        exceptions. Its session has held output (bytes keep their order). Or applying
        wrote something new. A Sync the disk had no room for is held and run again
        (`_stall`)."""
        if error is not None and is_disk_full(error) and not self._stopped:
            self._stall(sync, output, error)
            return
        self._sync = None
        self._sync_output = []
        node = self.node
        if error is None:
            self.disk.succeeded()
        try:
            if error is not None:
                raise error
            self._send(output)
            self._held += self._take_output()
            before = group_commit.pending_writes(node)
            pass_time(node)
            group_commit.end_sync(node, sync)
            self._send_cluster_output()  # the Raft messages this Sync made durable
            released = self._take_output()
        except Exception:
            self._fatal()
            return
        after = group_commit.pending_writes(node)
        if after is None or after != before:
            self._held += released
        else:
            waiting = {session for session, data, closed in self._held if data or closed}
            self._send([item for item in released if item[0] not in waiting])
            self._held += [item for item in released if item[0] in waiting]
        self.flush()

    def _stall(self, sync, output, error: OSError) -> None:
        """`sync` found the disk full and undid its writes. Keep it: no other Sync
        begins, and its output waits with it. Set the disk alarm. Give the reserve
        back and run it again. That is at once if that freed space, else a little
        later."""
        delay = self.disk.failed(error)
        self.check_alarms()
        self._send_urgent(time.monotonic())   # connection.blocked, before the retry
        self._retry = self._loop.call_later(delay, self._run_again, sync, output)

    def _run_again(self, sync, output) -> None:
        self._retry = None
        if self._stopped:
            self._sync = None
            return
        self._writer.submit(sync, lambda error: self._synced(sync, output, error))

    def _fatal(self) -> None:
        self._stopped = True  # nothing more is written or sent
        if self.on_fatal is None:
            raise
        # a bug or a failed disk: this node's state can no longer be trusted to move
        # on. Stop (what was confirmed is on disk) rather than sit there answering nobody.
        log.critical("the node failed while applying or persisting its logs; stopping it",
                     exc_info=True)
        self.on_fatal()

    def _take_output(self) -> list[tuple[Session, list, bool]]:
        """Every session's pending buffers (not joined: `_send` hands the list to the
        transport, whose writelines sends it without a copy), and whether it closed
        after them."""
        node = self.node
        dirty = list(node.dirty)
        node.dirty.clear()
        output = []
        for session in dirty:
            connection = self.connections.get(session)
            if connection is None:
                continue
            data = session.chunks_to_send(pull=not connection.write_paused)
            output.append((session, data, session.closed))
            if session.handing_over is not None and session not in self._handovers:
                self._begin_handover(connection)  # placed on a path other than receive
            if session.streaming and not connection.write_paused:
                # more of a stream: the next chunk on the loop's next turn, after other
                # clients' events (resume_writing brings it back once paused)
                node.dirty.add(session)
                self.schedule_flush()
        return output

    def _send(self, output: list[tuple[Session, list, bool]]) -> None:
        now = time.monotonic()
        for session, data, closed in output:
            connection = self.connections.get(session)
            if connection is None:
                continue
            transport = connection.transport
            if data:
                writelines = getattr(transport, "writelines", None)
                if writelines is not None:
                    writelines(data)
                else:  # a direct connection's (management/direct.py)
                    transport.write(b"".join(data))
                session.sent(now)
            if closed:
                timed_out = session.connection.handshake_timed_out  # logged by the session
                if not timed_out:
                    log.info("closing AMQP connection %s: %s", connection.peer,
                             session.close_reason)
                self.connections.pop(session, None)
                linger = session.connection.linger
                if timed_out:  # dropped at once, as rabbit_reader does
                    getattr(transport, "abort", transport.close)()
                elif linger:  # refused early: the socket stays open, unread, a while
                    transport.pause_reading()
                    self._lingering.add(transport)
                    self._loop.call_later(linger, self._close_lingering, transport)
                else:
                    self._close_after_output(transport)
            elif session.paused or session.input_held:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _close_after_output(self, transport) -> None:
        """Close a connection the broker is done with without losing its last frames.

        A socket closed while the client's input is still unread goes out as a TCP
        reset. (The broker stopped reading at a framing error; the client sent on
        without reading.) A reset throws away what the client has not received yet:
        the tail of a delivery, the connection.close that says why.

        So on plain TCP:
        - the write side is shut once what is buffered is sent (a FIN after the last
          frame);
        - what still arrives is read and dropped (the session is closed);
        - the socket closes when the client closes its side, CLOSE_DRAIN_SECONDS at
          most.
        Over TLS (no half-close) it closes at once, as before. So do the management
        API's in-process connections."""
        can_write_eof = getattr(transport, "can_write_eof", None)
        if can_write_eof is None or not can_write_eof():
            transport.close()
            return
        transport.write_eof()
        transport.resume_reading()
        self._lingering.add(transport)
        self._loop.call_later(CLOSE_DRAIN_SECONDS, self._close_lingering, transport)

    def _send_urgent(self, now: float) -> None:
        """While output waits for a Sync, some frames go out now. They are each open
        client's heartbeats and connection.blocked/unblocked: whole frames, ahead of
        what waits. A blocked client is read no more, as RabbitMQ's reader stops."""
        for session, connection in list(self.connections.items()):
            if not isinstance(connection, _Connection):
                continue
            data = session.urgent_to_send()
            if data:
                connection.transport.write(data)
                session.sent(now)
            if session.paused:
                connection.transport.pause_reading()

    def _close_lingering(self, transport) -> None:
        self._lingering.discard(transport)
        transport.close()

    async def wait_synced(self) -> None:
        """Until no Sync runs (stop() needs the stores to itself). A Sync held for a
        full disk is not waited for: nothing it covers was confirmed."""
        while self._sync is not None and self._retry is None:
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------ timers

    def _arm_deadline(self) -> None:
        """A timer for the moment a queue next expires a message or itself
        (Node.next_deadline_ms), unless one as early is set."""
        due = self.node.next_deadline_ms()
        if due is None or self._stopped or self._loop is None or (
                self._deadline is not None and self._deadline[0] <= due):
            return
        if self._deadline is not None:
            self._deadline[1].cancel()
        delay = max(0.0, (due - now_ms() + 1) / 1000)
        self._deadline = (due, self._loop.call_later(delay, self._deadline_reached))

    def _deadline_reached(self) -> None:
        self._deadline = None
        pass_time(self.node)
        try:
            self.node.run_deadlines()
        except Exception:  # a bug must not stop expiry: the ticker still runs it
            log.exception("queue deadlines failed")
        self.schedule_flush()  # which arms the next one

    async def _tick_forever(self) -> None:
        """Twice a second: heartbeats and handshake timeouts, queue expiry, metadata
        timeouts, policies, shovels, and the alarms every alarm_check_interval. Each
        step runs on its own (periodic.py): one that raises is logged and skipped for
        that round, the others and the next rounds go on."""
        steps = Steps("ticker", log)
        next_alarm_check = 0.0
        while True:
            await asyncio.sleep(0.5)
            now = pass_time(self.node)
            steps.run("heartbeats", self._tick_sessions, now)
            if self._sync is not None:  # a slow or full disk: heartbeats need no fsync
                steps.run("urgent frames", self._send_urgent, now)
            steps.run("quorum queue timers", self.node.quorum.tick, now_ms())
            steps.run("queue expiry", self.node.tick_queues)
            # metadata changes waited on for too long
            steps.run("metadata timeouts", self.node.cluster.meta.expire, now)
            steps.run("membership answers", membership.check_visible, self.node, now)
            steps.run("policies", self.node.tick_policies)
            steps.run("shovels", self.run_shovels)
            if now >= next_alarm_check:
                next_alarm_check = now + self.settings.alarm_check_interval
                steps.run("resource alarms", self.check_alarms)
            self.schedule_flush()

    def _tick_sessions(self, now: float) -> None:
        """Every connection's timers; one whose tick raises is dropped (logged), the
        others still tick."""
        for session in list(self.connections):
            try:
                session.tick(now)
            except Exception:
                connection = self.connections.get(session)
                log.exception("closing AMQP connection %s: its timers failed",
                              getattr(connection, "peer", "?"))
                if connection is not None:
                    connection.transport.close()
                continue
            if session.closed:
                self.node.dirty.add(session)

    def run_shovels(self) -> None:
        """The dynamic shovels run on the node that leads the metadata group. That
        is one node of the cluster, known to every node. Another takes over as soon
        as that node goes away (a new leader is elected). A node that stops leading
        stops its shovels. RabbitMQ too runs a dynamic shovel on one node of the
        cluster."""
        leading = self.node.cluster.meta.is_leader
        self.shovels.reconcile(self.node.shovel_parameters() if leading else {})

    def _shovel_finished(self, vhost: str, name: str) -> None:
        """A shovel reached its src-delete-after: it clears its own parameter."""
        from ..groups import metadata as meta

        data = meta.encode("parameter.clear", component="shovel", vhost=vhost, name=name)
        self.node.cluster.meta.propose_data(data, lambda _reply: None)
        self.schedule_flush()

    async def _raft_tick_forever(self) -> None:
        """Raft's clock, on every node: elections and heartbeats every raft tick
        (`raft.tick_interval_ms`, 100 ms by default)."""
        from ..node import membership

        settings = self.settings
        interval = settings.raft_tick_ms / 1000
        cluster = self.node.cluster
        ticks = 0
        # CMR: first a trigger_interval after this node started (a node joining is one
        # of the guide's trigger events), then every interval; a trigger event applied
        # (node/node.py CMR_TRIGGERS) brings the next run to a trigger_interval after it
        next_cmr = time.monotonic() + settings.cmr_trigger_interval_ms / 1000
        events_seen = self.node.membership_events
        # a tick late by half the shortest election timeout means the loop was busy
        # that long: no heartbeat left meanwhile, so followers may be about to elect
        election_ms = self.node.quorum.raft_config.election_ticks * settings.raft_tick_ms
        expected = time.monotonic() + interval
        next_lag_warning = 0.0
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            late_ms = (now - expected) * 1000
            expected = now + interval
            if late_ms >= election_ms / 2 and now >= next_lag_warning:
                next_lag_warning = now + 10.0   # at most one such line per 10 s
                log.warning("raft tick %d ms late: the event loop was busy longer than half "
                            "the election timeout (%d ms); no heartbeat left meanwhile",
                            late_ms, election_ms)
            try:
                self.node.quorum.raft_tick()
                cluster.tick()
                ticks += 1
                if self.node.membership_events != events_seen:
                    events_seen = self.node.membership_events
                    next_cmr = min(next_cmr, time.monotonic()
                                   + settings.cmr_trigger_interval_ms / 1000)
                if ticks * settings.raft_tick_ms >= 500:
                    ticks = 0
                    membership.reconcile(self.node)
                    if settings.cmr_enabled and time.monotonic() >= next_cmr:
                        next_cmr = time.monotonic() + settings.cmr_interval_ms / 1000
                        membership.continuous_reconciliation(
                            self.node, settings.cmr_target_group_size or None,
                            settings.cmr_auto_remove)
            except Exception:  # a bug must not stop this node's Raft clock
                log.exception("cluster tick failed")
            self.schedule_flush()

    def resident_memory(self) -> int:
        return resident_memory_bytes()

    def memory_limit(self) -> int:
        return self.settings.memory_limit(self.settings.total_memory(total_memory_bytes()))

    def disk_free_limit(self) -> int:
        return self.settings.disk_free_limit(self.settings.total_memory(total_memory_bytes()))

    def check_alarms(self) -> None:
        """RabbitMQ's resource monitors.

        The memory alarm compares the process's resident set size with the high
        watermark. That is RabbitMQ's default `rss` strategy, read from
        /proc/self/statm as vm_memory_monitor does. The disk alarm compares the free
        bytes of the data directory's file system with the limit. The disk alarm also
        holds while a write finds the disk full. It holds too while the disk reserve
        is given back. The reserve is taken again, and the alarm cleared, once the
        file system has room for it and the limit."""
        memory = resident_memory_bytes()
        limit = self.memory_limit()
        self._alarm("memory", memory > limit, "vm_memory_high_watermark %s. Memory used:%d "
                    "allowed:%d", memory, limit)
        limit = self.disk_free_limit()
        low, free = self.disk.low(limit)
        self._alarm("disk", low, "Free disk space is %s. Free bytes: %d. Limit: %d",
                    free, limit)

    def _alarm(self, resource: str, active: bool, text: str, used: int, limit: int) -> None:
        """Set or clear an alarm, logging as rabbit_alarm and the monitors do."""
        if active == (resource in self.node.alarms):
            return
        if resource == "memory":
            log.info(text, "set" if active else "clear", used, limit)
        else:
            log.info(text, "insufficient" if active else "sufficient", used, limit)
        if active:
            log.warning("%s resource limit alarm set on node %s.\n\n"
                        "**********************************************************\n"
                        "*** Publishers will be blocked until this alarm clears ***\n"
                        "**********************************************************",
                        resource, self.settings.node_name)
        else:
            log.warning("%s resource limit alarm cleared on node %s", resource,
                        self.settings.node_name)
        self.node.set_alarm(resource, active)
