"""The node's quorum queues: Raft groups over one log store, driven in group commit.

Responsibilities:
- Create, recover and delete the Raft groups behind quorum queues.
- Be the Ready loop's handler (broker/groups/driver.py) for every group on the
  node: cluster sends (`send`), committed entries through the fifo machine
  (`apply`), and what follows (`advanced`: leader news, snapshots).
- Turn the machine's effects into AMQP work:
  - deliveries to this node's consumers (queues/quorum/deliveries.py: bodies read
    back from the log);
  - replies to whoever waited for an entry;
  - snapshots and log release at the machine's release cursor, when one is due
    (`_snapshot_due`, Ra's rule);
  - dead lettering (`_dead_letter`). The leader publishes a message the machine
    dropped to the queue's dead-letter exchange, at most once. That goes through
    node/dead_letters.py, as for classic queues. With at-least-once dead
    lettering, the leader's dead-letter worker does it instead (`_ensure_worker`,
    queues/quorum/dead_letter_worker.py);
  - queue TTL (`_delete_expired`): the leader deletes an expired queue through the
    metadata.
- Time: Tick commands for lease, message and queue expiry.

How it works: the node's group commit (node/group_commit.py) runs one round at a
time.
1. `begin_round` collects a Ready from every group. It appends their entries and
   hard states to the log store (`driver.persist_round`).
2. It hands the leaders' appends to the transport (`driver.send_early`). Followers
   write them while this node's fsync runs.
3. It seals the store's batch. The batch is written and fdatasynced: one fsync
   for all groups, on the server's writer thread.
4. Then `end_round` sends the rest, applies what is committed and advances
   (`driver.finish_round`).
5. It then applies at once whatever is committed and already durable
   (`driver.apply_round`). A single-member group commits its own entries when the
   fsync completes. A leader may have heard its peers' acknowledgements while it
   ran. Neither waits for the next round's fsync of entries proposed meanwhile.
Proposals made while applying (settling a no-ack delivery...) get one more round.
A round begins with what the queues held back (`_propose_held`). That is a queue's
settlements, one command per consumer and kind. And its publishes since the last
round, one run of entries (one append). Replies are written to the sessions'
buffers. Publisher confirms are answered as data (queues/base.py `Confirm`); the
node writes the due ones after the round (node/group_commit.py `end_sync`). The
server sends them only after the fsync that covers them.

After a restart, every entry in the log is replayed into a fresh machine, from the
latest snapshot on. Consumers recorded in it belonged to connections that are gone.
Their deliveries during the replay are not sent. Once the replay is applied, the
commands of fifo/machine.py `stale_downs` remove them. First a Cancel per old
consumer: so none of them is handed the others' messages, or made the single active
consumer, meanwhile. Then a Down per old connection. It returns their messages,
delivery count + 1 for the delivery made before the crash. RabbitMQ does the same
when a consumer's process is down.

Not here: the fifo semantics (broker/fifo), consensus (broker/raft), the on-disk
format (broker/raft/storage), AMQP framing (channel, session).
"""

from __future__ import annotations

import logging
import random
from array import array
from bisect import bisect_right

from ...fifo import commands, snapshot
from ...fifo.commands import BLIND_ENQUEUE, Deliver, Down, Enqueue, Meta
from ...fifo.envelope import TIMED, TIMED_HEAD, decode_entry
from ...fifo.in_place import enqueue_in_place, enqueue_run_in_place
from ...fifo.machine import apply, live_indexes, next_expiry, queue_expiry, stale_downs
from ...fifo.state import FifoState, fifo_config
from ...groups import driver
from ...groups.replicated import ReplicatedGroup
from ...raft import COMMAND, RaftConfig, RaftNode, Ready
from ...raft.forwarded import FORWARDED, HEAD_SIZE, NEVER, AppliedIds, load_snapshot, unwrap
from ...raft.storage import LogStore
from ...raft.storage.errors import is_disk_full
from ..actions import carry_out
from ..deadlines import Deadlines
from . import deliveries
from .dead_letter_worker import DeadLetterWorker
from .host import QuorumCluster, QuorumHost
from .queue import MessageGone, QuorumQueue, group_uid  # noqa: F401 (importable here)

# Entries a release cursor may pass before it takes a snapshot without freeing a
# segment file (Ra's MIN_SNAPSHOT_INTERVAL, the same 4,096).
MIN_SNAPSHOT_INTERVAL = 4096
_NO_TERM = 1 << 64  # above every term: no waiter to doom, no entry_committed due

log = logging.getLogger("quorumqueue.broker")




def replay_bound(replay_until: int, ready: Ready) -> int:
    """Entries up to `replay_until` were in the log when this node started.
    Applying them again is a replay: their deliveries went to connections that are
    gone. A Ready may replace part of that log: a leader's entries over an
    uncommitted tail (`truncate_from`), or a snapshot. That lowers the bound. What
    is applied there now is new, and its deliveries must be written. Else a consumer
    that joined after the restart waits forever for messages the machine handed
    it."""
    if ready.truncate_from is not None:
        replay_until = min(replay_until, ready.truncate_from - 1)
    if ready.snapshot is not None:
        replay_until = min(replay_until, ready.snapshot.meta.index)
    return replay_until


class QuorumGroups:
    def __init__(self, store: LogStore, member: str, host: QuorumHost,
                 cluster: QuorumCluster, raft_config: RaftConfig | None = None, tick_interval_ms: int = 1000,
                 snapshot_over_live: bool = True, dead_letter_prefetch: int = 32,
                 dead_letter_confirm_timeout_ms: int = 180_000) -> None:
        self.store = store
        self.host = host  # the node (host.py): its run, channels, dead letters
        # the at-least-once dead-letter workers' settings (dead_letter_worker_*)
        self.dead_letter_prefetch = dead_letter_prefetch
        self.dead_letter_confirm_timeout_ms = dead_letter_confirm_timeout_ms
        # may a snapshot cover live messages? Only where no other member can ever need
        # the entries below it (their bodies): on a node started without cluster
        # configuration, which no node can join. Then the log below a snapshot is
        # compacted too (`_maybe_compact`); in a cluster a snapshot waits below the
        # lowest live message (`_snapshot_below_live`)
        self.snapshot_over_live = snapshot_over_live
        self.member = member
        # quiescing (raft/config.py): an idle group with peers sends no heartbeats and
        # ticks nowhere; the cluster's failure detector wakes its members
        # (`member_lost`), as RabbitMQ's Ra relies on a failure detector per node
        self.raft_config = raft_config or RaftConfig(quiesce=True)
        # group uid -> queue (or the cluster's metadata group: broker/groups/metadata.py)
        self.queues: dict[str, QuorumQueue] = {}
        self.cluster = cluster  # the node's cluster (host.py): Raft traffic, forwarding
        self.tick_interval_ms = tick_interval_ms
        self._random = random.Random()
        # quorum queues holding settlements or publishes not proposed yet
        # (QuorumQueue.settle, QuorumQueue.publish): proposed at the next round
        self.holding: set[QuorumQueue] = set()
        # monotonic seconds as the shell last told the node (Node.set_clock: before
        # each Sync begins and ends): it times an entry from storage to commit for the
        # commit-latency gauge (`_time_appends`, `apply`); no decision depends on it
        self.now = 0.0
        # wall-clock milliseconds, as the shell last told the node: every Enqueue
        # proposed here carries it (message TTLs count from it)
        self.clock_ms = 0
        # group uid -> the dead-letter worker of a queue this node leads with
        # at-least-once dead lettering (queues/quorum/dead_letter_worker.py)
        self.dlx_workers: dict[str, DeadLetterWorker] = {}
        # group uid -> the Ready a full disk stopped (a snapshot install that found no
        # room): that group waits, the others go on; tried again each round (driver.py)
        self.held_readies: dict = {}
        # the groups that had input since they were last asked for a Ready (an ordered
        # set: their cores add themselves, raft/core.py): a round asks only these
        self.awake: dict[str, None] = {}
        # when a queue this node leads next has a message or itself to expire: the
        # node wakes then and the leader proposes the Tick at once (`tick_queue`)
        self.deadlines = Deadlines()
        # The periodic timers visit only the groups that need them, never every group
        # (an idle queue costs nothing per tick). Each set (ordered, a dict) gains a
        # group when something happens to it: `ticking` when its core wakes
        # (`_take_awake`), the others after each of its Readies (`_watch`). A timer
        # drops a group it finds needing nothing.
        # groups whose Raft core needs ticks (RaftNode.needs_tick): `raft_tick`
        self.ticking: dict[str, None] = {}
        # quorum queues whose leader has something timed (`_timed`): `tick`
        self.timed: dict[str, None] = {}
        # quorum queues this node leads with consumers, or NodeDown/NodeUp commands
        # proposed (cluster/consumer_nodes.py `tick`)
        self.watched: dict[str, None] = {}
        # quorum queues whose leader may not have compared its settings with the
        # policy in its term yet (QuorumQueue.policy_due): Node.tick_policies
        self.policy_due: dict[str, None] = {}
        # (vhost, name) of the quorum queues whose Raft members may have to follow
        # their record (node/membership.py `reconcile`)
        self.membership_due: dict[tuple[str, str], None] = {}

    # ------------------------------------------------------------ lifecycle

    def create(self, vhost: str, name: str, arguments: dict, uid: str | None = None,
               members: tuple[str, ...] = (), campaign: bool = True) -> QuorumQueue:
        """A new group. `members` (default: this node alone) all start it from the
        same configuration. With several members, this one campaigns if `campaign`:
        it is the leader's intended place. The others wait for it, or time out and
        elect another."""
        uid = uid or group_uid(vhost, name)
        members = tuple(members) or (self.member,)
        if self.member not in members:  # a replica elsewhere: only the record is here
            return self._remote(vhost, name, arguments, uid, members)
        self.store.set_initial_members(uid, list(members))
        return self._start(vhost, name, arguments, uid, FifoState(config=fifo_config(arguments)),
                           members, campaign or len(members) == 1)

    def recover(self, vhost: str, name: str, arguments: dict, uid: str,
                members: tuple[str, ...] = ()) -> QuorumQueue:
        """Open an existing group: restore the latest snapshot; the first flush replays
        the log after it."""
        members = tuple(members) or (self.member,)
        if uid not in self.store.groups():
            if self.member not in members:
                return self._remote(vhost, name, arguments, uid, members)
            # declared, but the process died before the group's first flush: start empty
            self.store.set_initial_members(uid, list(members))
        stored = self.store.read_snapshot(uid)
        applied, machine = (load_snapshot(stored[1], commands.decode_reply) if stored
                            else (AppliedIds(), None))
        state = snapshot.load(machine) if stored else FifoState(config=fifo_config(arguments))
        queue = self._start(vhost, name, arguments, uid, state, members, len(members) == 1)
        queue.applied = applied
        queue.replay_until = self.store.last_index(uid)
        if stored:  # the snapshot's messages' entries were not applied here
            queue.blind_upto = stored[0].index
        return queue

    def _start(self, vhost: str, name: str, arguments: dict, uid: str,
               state: FifoState, members: tuple[str, ...], campaign: bool) -> QuorumQueue:
        raft = self.new_core(uid)
        if campaign:
            raft.campaign()  # a group of one elects itself at once
        queue = QuorumQueue(vhost, name, arguments, uid, raft, state, members,
                            self.cluster, self)
        self.queues[uid] = queue
        return queue

    def new_core(self, uid: str) -> RaftNode:
        """This node's Raft core of group `uid`, over the log store, woken with the
        others (`awake`)."""
        self.ticking[uid] = None  # until its first tick finds it needs none
        return RaftNode(self.member, self.raft_config, self.store.group_log(uid),
                        self._random, self.awake, uid)

    def _remote(self, vhost: str, name: str, arguments: dict, uid: str,
                members: tuple[str, ...]) -> QuorumQueue:
        """The record of a queue with no replica on this node (no Raft member here).
        Its commands go to the leader through the cluster (proxying)."""
        return QuorumQueue(vhost, name, arguments, uid, None,
                           FifoState(config=fifo_config(arguments)), members, self.cluster, self)

    def join(self, queue: QuorumQueue) -> None:
        """This node was named a member of an existing queue. It gets an empty
        replica, which the leader adds to the group and fills (entries or a
        snapshot)."""
        if queue.group in self.store.groups():
            self.store.delete_group(queue.group)  # a stale replica from an earlier time
        queue.raft = self.new_core(queue.group)
        queue.state = FifoState(config=fifo_config(queue.arguments))
        queue.applied = AppliedIds()
        queue.joined_at = self.now
        self.queues[queue.group] = queue
        log.info("quorum queue '%s' in vhost '%s': replica started on %s", queue.name,
                 queue.vhost, self.member)

    def leave(self, queue: QuorumQueue) -> None:
        """This node is no longer a member: drop the replica (the node cancelled its
        consumers here first); the record stays."""
        self.queues.pop(queue.group, None)
        self.held_readies.pop(queue.group, None)
        self._stop_worker(queue)
        queue.fail_waiters()
        queue.raft = None  # the record stays, proxying to the leader
        self.store.delete_group(queue.group)
        queue.state = FifoState(config=fifo_config(queue.arguments))
        queue.applied = AppliedIds()
        log.info("quorum queue '%s' in vhost '%s': replica on %s removed", queue.name,
                 queue.vhost, self.member)

    def add_group(self, member: ReplicatedGroup) -> None:
        """Drive another replicated thing (the metadata group) in the same cycle."""
        self.queues[member.group] = member

    def delete(self, queue: QuorumQueue) -> None:
        self._stop_worker(queue)
        queue.deleted = True
        queue.fail_waiters()
        self.held_readies.pop(queue.group, None)
        if self.queues.pop(queue.group, None) is not None:
            self.store.delete_group(queue.group)

    def orphans(self, known: set[str]) -> list[str]:
        """Groups in the log store that no queue in the metadata names (deleted while
        the process was dying): deleted now."""
        known = known | set(self.queues)  # the metadata group is no queue's
        gone = [uid for uid in self.store.groups() if uid not in known]
        for uid in gone:
            self.store.delete_group(uid)
        return gone

    # ------------------------------------------------------------ the Ready cycle

    def flush(self) -> None:
        """The groups' rounds alone, here and now, until no group has a Ready.
        The fsyncs run on this thread. `Node.flush` does this with the other
        stores."""
        for _round in range(driver.MAX_ROUNDS):
            self._propose_held()
            readies = driver.persist_round(self.store, self._take_awake())
            self._time_appends(readies)
            self.store.flush()
            driver.finish_round(readies, self)
            self._settle_dead_letters()
            if not readies:
                return

    def begin_round(self) -> driver.Round:
        """One round in halves, for a shell that fsyncs off its event loop.
        Every group's Ready is persisted and sealed. The round's `make_durable()`
        makes it durable, on any thread. Call `end_round` once that returned."""
        self._propose_held()
        waiting = len(self.held_readies)
        readies = driver.persist_round(self.store, self._take_awake(), self.held_readies)
        if len(self.held_readies) > waiting:
            log.warning("no room on disk for the snapshot of %s: %s waits (its other "
                        "members go on); tried again each round",
                        ", ".join(sorted(self.held_readies)),
                        "it" if len(self.held_readies) == 1 else "they")
        self._time_appends(readies)
        driver.send_early(readies, self)  # leaders' appends: while the fsync runs
        return driver.Round(readies, self.store.seal())

    def _take_awake(self) -> list[ReplicatedGroup]:
        """The members to ask for a Ready this round. They are those woken since
        the last one, and those whose Ready a full disk holds. The set starts empty
        again. A round costs what its groups did, not what the node holds. An idle
        group costs nothing."""
        awake = self.awake
        keys = [*awake, *(g for g in self.held_readies if g not in awake)]
        awake.clear()
        members = self._members(keys)
        ticking = self.ticking
        for member in members:  # an input may have given it peers, or a new role
            if member.raft.needs_tick:
                ticking[member.group] = None
        return members

    def _members(self, keys) -> list[ReplicatedGroup]:
        queues = self.queues
        return [member for key in keys
                if (member := queues.get(key)) is not None and member.raft is not None]

    def _propose_held(self) -> None:
        """Into this round: what the queues settled since the last round, and what
        was published to them. Settlements are one command per consumer and kind
        (QuorumQueue.settle). Publishes are one run per queue (QuorumQueue.publish)."""
        if self.holding:
            holding, self.holding = self.holding, set()
            for queue in holding:
                queue.flush_held()

    def _time_appends(self, readies: driver.Batch) -> None:
        """Start timing the last entry a group hands to storage. Not if one of the
        group's entries is timed already. One at a time: a cost per round, not per
        entry."""
        for member, _raft, ready in readies:
            if ready.entries and member.commit_probe is None:
                member.commit_probe = (ready.entries[-1].index, self.now)

    def end_round(self, round_: driver.Round) -> None:
        """The round is durable (`make_durable` returned). Send, apply and advance
        its Readies. Then apply what that made committed and durable, and what peers
        committed meanwhile."""
        self.store.synced(round_.log)
        driver.finish_round(round_.readies, self, sent_early=True)
        # the round's groups (each woke at its advance) and those stepped meanwhile
        driver.apply_round(self._members(list(self.awake)), self, self.held_readies)
        self._settle_dead_letters()

    def _settle_dead_letters(self) -> None:
        """The dead-letter workers' settles of what their targets confirmed meanwhile.
        (The channels' confirms that quorum replies answered are the node's to send:
        queues/base.py `Confirm`, node/group_commit.py `end_sync`.)"""
        for worker in self.dlx_workers.values():
            if worker.settled:
                worker.flush()

    # the driver's ReadyHandler: send, apply, advanced

    def send(self, queue: ReplicatedGroup, messages) -> None:
        """Raft messages to the group's peers. The driver calls this only once what
        they promise is durable. A leader's appends promise nothing of this node's
        disk. They leave while the round's fsync runs (driver.leaves_early)."""
        self.cluster.send_raft(queue.group, messages)

    def apply(self, queue: ReplicatedGroup, ready: Ready) -> None:
        """A snapshot from the leader, then the committed entries. Commands go to
        the group's machine, replies to whoever waited for them. A forwarded command
        whose identity was applied before is skipped (groups/replicated.py `admit`).
        The others' identities are recorded as they are applied."""
        if queue.replay_until:
            queue.replay_until = replay_bound(queue.replay_until, ready)
        probe = queue.commit_probe
        if probe is not None and ready.commit_index >= probe[0]:
            queue.commit_latency_s = self.now - probe[1]
            queue.commit_probe = None
        if ready.snapshot is not None:
            queue.restore(ready.snapshot.data)
            if isinstance(queue, QuorumQueue):  # (the metadata group comes here too)
                queue.blind_upto = max(queue.blind_upto, ready.snapshot.meta.index)
            queue.snapshot_installed(ready.snapshot.meta.index, ready.snapshot.meta.term)
        if isinstance(queue, QuorumQueue):
            self._apply_entries(queue, ready.committed)
            return
        for entry in ready.committed:  # the cluster's metadata group (groups/metadata.py)
            if queue.deleted:
                break
            if queue.waiters:
                queue.entry_committed(entry.index, entry.term)
            if entry.kind != COMMAND:  # NOOP, MEMBERSHIP: nothing for the machine;
                for callback in queue.take_waiters(entry.index, entry.term):  # barriers
                    callback(None)
                continue
            data, start, identity = entry.data, 0, None
            if data[0] == FORWARDED:  # the command starts after its identity
                identity, start = queue.admit(entry.index, entry.term, data)
                if start is None:
                    continue  # applied before: its waiters have the first reply
            reply = queue.apply(entry.index, entry.term, data[start:] if start else data)
            if identity is not None:
                queue.applied.keep_reply(identity, reply)  # admitted above
            for callback in queue.take_waiters(entry.index, entry.term):
                callback(reply)

    def advanced(self, queue: ReplicatedGroup, ready: Ready) -> None:
        """After the group advanced: news of its leader. Then the work that follows
        applying: snapshots and log release, a restart's Down commands."""
        if ready.leader_changed:
            if ready.leader_id == self.member:  # operators (and the fault suite) read it
                log.info("group %s: %s is the leader in term %d", queue.group,
                         self.member, ready.term)
            self.cluster.leader_changed(queue)
            if ready.leader_id is not None:
                queue.leader_known()
        if queue.deleted:
            return
        if isinstance(queue, QuorumQueue):
            leading = queue.is_leader  # nothing that follows changes it
            self._after_apply(queue, leading)
            self._watch(queue, leading)
        else:
            queue.after_apply()

    # ------------------------------------------------------------ the fifo machine

    def _apply_entries(self, queue: QuorumQueue, entries) -> None:
        """A Ready's committed entries through the fifo machine, one loop for the run.

        Per entry, the calls of `ReplicatedGroup.entry_committed` and `take_waiters`
        are inlined where they would do nothing. Each command (at `start` in its
        data) is applied. Its identity is recorded (a forwarded one). The reply goes
        to its waiters. Then come its effects. A snapshot taken there includes the
        identity. A forwarded command that came before a lower seq of its node is
        held, and applied after the entry that lets it through (`_apply_released`).

        The usual entry, a publish into a queue nothing watches, is stored by
        fifo/in_place.py straight from its bytes (no Enqueue, Meta or effects are
        made); what it declines goes through `decode` and `apply`. After one stored
        so, the entries that follow are offered to its run (`_store_run`): a batch
        publish's messages are stored there in one loop, their waiters answered
        after it.

        One merge: consecutive Enqueues whose only effect is a Deliver. (Consumers
        with room while messages arrive.) Each consumer's messages are held as one
        batch, handed over after the last of the run, consumers in the order of
        their first delivery. That is one log read and one run of frames per
        consumer, where one Deliver per message cost a call of each: with several
        consumers the machine's round-robin gives each Enqueue to the next one, so
        a batch of one consumer alone held one message. (A consumer's messages stay
        in the machine's order; two consumers on one channel may see theirs grouped,
        as the machine's own Deliver effects of one command group them, and as
        rabbit_fifo's checkout does.) Nothing else is let past the held batches.
        They go out before any other entry is applied and before any other effect.
        So a consumer sees its deliveries in the machine's order, before what
        follows them: a cancel-ok, a get-ok, a Return. Only the publishes'
        confirms, on their publishers' channels, may go out before the deliveries
        of the same messages. RabbitMQ orders neither before the other."""
        decode = commands.decode
        unpack_time = TIMED_HEAD.unpack_from
        timed_size = TIMED_HEAD.size
        held: dict[str, list] = {}  # consumer key -> its held deliveries, in order
        index = position = 0
        count = len(entries)
        while position < count:
            entry = entries[position]
            position += 1
            if queue.deleted:
                break
            applied = queue.applied
            # what the previous entry let through, in order; or a gap held too long,
            # given up by this entry (forwarded.py): then released at this entry's
            # index, also when it is a round's first (`index` is still 0 then)
            released_at = index
            if entry.index >= applied.give_up_at or applied.give_up_ms != NEVER:
                if not applied.released:
                    released_at = entry.index
                self._maybe_give_up(applied, entry)
            if applied.released:
                if held:
                    _deliver_held(self, queue, held)
                self._apply_released(queue, released_at)
            index, term, data = entry.index, entry.term, entry.data
            waiters = queue.waiters  # (fail_waiters replaces the dict)
            if waiters and term > queue.applied_term:  # twin: entry_committed's early return
                queue.entry_committed(index, term)
            if entry.kind != COMMAND:  # NOOP, MEMBERSHIP: nothing for the machine;
                if held:
                    _deliver_held(self, queue, held)
                for callback in queue.take_waiters(index, term):  # barriers
                    callback(None)
                continue
            start, identity = 0, None
            if data[0] == FORWARDED:  # the command starts after its identity
                identity, start = queue.admit_in_order(index, term, data)
                if start is None:
                    continue  # applied before (its waiters have the first reply), or held
            if data[start] == TIMED:  # twin of fifo/envelope.py decode_entry, in place
                queue.last_time_ms = unpack_time(data, start)[1]
                start += timed_size
            reply = enqueue_in_place(queue.state, index, queue.last_time_ms, data, start)
            if reply is None:  # not an Enqueue stored the short way (fifo/in_place.py)
                command = decode(data, start)
                if data[start] == BLIND_ENQUEUE:  # its BCC keys: no read may send them
                    queue.blind_upto = index
                if held and type(command) is not Enqueue:
                    _deliver_held(self, queue, held)
                queue.state, reply, effects = apply(Meta(index, term, queue.last_time_ms),
                                                    command, queue.state)
            else:  # a tag 1 Enqueue: no BCC keys, no held batch let out, no effects
                command = None
            if identity is not None and reply != "ok":
                # a publish's "ok" is not kept: a duplicate's waiter takes None as
                # stored too
                queue.applied.keep_reply(identity, reply)
            if waiters:  # a follower's entries, mostly, have none
                waiting = waiters.pop(index, None)
                if waiting:
                    if len(waiting) == 1 and waiting[0][0] in (term, None):
                        waiting[0][2](reply)  # twin of take_waiters' usual case
                    else:
                        waiters[index] = waiting
                        for callback in queue.take_waiters(index, term):
                            callback(reply)
            if command is None:  # stored in place: nothing follows; the entries
                if reply == "ok" and position < count:  # after it may be a run of such
                    position, index = _store_run(queue, entries, position, index)
                continue
            replaying = index <= queue.replay_until
            if isinstance(command, Down) and not replaying:
                if command.connection.startswith(self.host.boot_id + "."):
                    queue.check_out_again(command.connection)
                elif queue.is_leader:  # a node with no replica learns it from the leader
                    self.cluster.tell_downed(queue, command.connection)
            if effects:  # often none (an enqueue with no consumer waiting): no call
                if (len(effects) == 1 and type(effect := effects[0]) is Deliver
                        and type(command) is Enqueue and not replaying):
                    batch = held.get(effect.consumer)
                    if batch is None:
                        held[effect.consumer] = list(effect.deliveries)
                    else:
                        batch += effect.deliveries
                    continue
                if held:
                    _deliver_held(self, queue, held)
                self._apply_effects(queue, effects, replaying)
        if held:
            _deliver_held(self, queue, held)
        if queue.applied.released and not queue.deleted:
            self._apply_released(queue, index)

    @staticmethod
    def _maybe_give_up(applied: AppliedIds, entry) -> None:
        """Give up the gaps held HOLD_ENTRIES entries or HOLD_MS of leader time, by the
        entry about to be applied: its index, its own stamp (raft/forwarded.py)."""
        time_ms, data = 0, entry.data
        if entry.kind == COMMAND and data:
            start = HEAD_SIZE if data[0] == FORWARDED else 0
            if len(data) > start and data[start] == TIMED:
                time_ms = TIMED_HEAD.unpack_from(data, start)[1]
        if entry.index >= applied.give_up_at or time_ms >= applied.give_up_ms:
            applied.give_up(entry.index, time_ms)

    def _apply_released(self, queue: QuorumQueue, at: int) -> None:
        """The pending forwarded entries whose turn came while entry `at` was applied
        (raft/forwarded.py `take_released`), in their origin's order. Each is read back
        from the log at its own index (the release cursor stayed at or below it) and
        applied there: an Enqueue's body is found at its index. Its waiters, and those
        of its repeats, get its reply, so a publisher's confirms follow its order. A
        release cursor it yields is not taken: the snapshot would be labelled with its
        index, not the log's position (the next entry's cursor comes instead). `at` is
        the log index applied last: its effects are a restart's replay (not carried
        out) only when `at` was in the log at the start."""
        applied = queue.applied
        replaying = at <= queue.replay_until
        while not queue.deleted and (released := applied.take_released()) is not None:
            _identity, ((index, term, _ms), *repeats) = released
            entry = self.store.entry(queue.group, index)
            if entry is None or entry.term != term:
                raise RuntimeError(f"quorum queue '{queue.name}': pending entry {index} "
                                   f"(term {term}) is missing from the log")
            identity, data = unwrap(entry.data)
            time_ms, command = decode_entry(data)
            if data[TIMED_HEAD.size if data[0] == TIMED else 0] == BLIND_ENQUEUE:
                queue.blind_upto = max(queue.blind_upto, index)
            if time_ms is not None and time_ms > queue.last_time_ms:
                queue.last_time_ms = time_ms  # (the queue's time never goes back)
            queue.state, reply, effects = apply(Meta(index, term, queue.last_time_ms),
                                                command, queue.state)
            if reply != "ok":
                applied.keep_reply(identity, reply)
            for waiter_index, waiter_term, _ms in ((index, term, _ms), *repeats):
                for callback in queue.take_waiters(waiter_index, waiter_term):
                    callback(reply)
            if isinstance(command, Down) and not replaying:
                if command.connection.startswith(self.host.boot_id + "."):
                    queue.check_out_again(command.connection)
                elif queue.is_leader:
                    self.cluster.tell_downed(queue, command.connection)
            effects = [e for e in effects if type(e) is not commands.ReleaseCursor]
            if effects:
                self._apply_effects(queue, effects, replaying)

    def _apply_effects(self, queue: QuorumQueue, effects, replaying: bool) -> None:
        """Deliveries to consumers, dead letters and release cursors.
        - Deliveries: none while replaying a restart's log (those connections are
          gone).
        - Dead letters: the leader's, not while replaying.
        - Release cursors: snapshots, once applied."""
        for effect in effects:
            match effect:
                case Deliver(consumer, messages):
                    if not replaying:
                        carry_out(deliveries.deliver(self, queue, consumer, messages))
                case commands.Dropped(index, reason):
                    if not replaying and queue.is_leader:
                        self._dead_letter(queue, index, reason)
                case commands.ActiveConsumerChanged(consumer):
                    if not replaying and queue.is_leader:
                        log.info("quorum queue '%s' in vhost '%s': single active consumer "
                                 "is now %s", queue.name, queue.vhost,
                                 "none" if consumer is None else repr(consumer))
                case commands.DlxDeliver(worker, letters):
                    current = self.dlx_workers.get(queue.group)
                    if not replaying and current is not None and current.identity == worker:
                        current.take(letters)
                case commands.QueueExpired(unused_ms):
                    if not replaying and queue.is_leader and not queue.expiry_proposed:
                        self._delete_expired(queue, unused_ms)
                case commands.ReleaseCursor(cursor, snapshot_index):
                    pending = queue.applied.lowest_pending()
                    if pending is not None and pending < cursor:
                        cursor = pending  # a pending entry is read back from the log
                    if not self._snapshot_due(queue, cursor, snapshot_index):
                        continue
                    if self.snapshot_over_live:
                        queue.pending_snapshot = (cursor, snapshot_index, queue.snapshot())
                    else:
                        self._snapshot_below_live(queue, cursor, snapshot_index)

    def _snapshot_due(self, queue: QuorumQueue, cursor: int, index: int) -> bool:
        """Whether a release cursor takes a snapshot, as Ra's log decides it
        (ra_log:update_release_cursor). It does when the cursor lets a segment file
        go. Or once MIN_SNAPSHOT_INTERVAL entries passed since the last snapshot.
        Else the cursor is let go; the next one carries on.

        Why: a queue drained as fast as it is filled reaches an empty state, so a
        release cursor, after nearly every round. A snapshot each time cost about a
        sixth of a broker's CPU under PerfTest's 1 producer + 1 consumer. (State
        encoded, a file written and renamed.) The log was only a few entries shorter
        for it. Entries below an untaken cursor stay in memory until the next
        snapshot: at most the interval's worth per queue."""
        current = self.store.snapshot_meta(queue.group)
        if current is None or index >= current.index + MIN_SNAPSHOT_INTERVAL:
            return True
        if queue.snapshot_candidates:  # a cluster's candidate waits for the cursor
            return True
        return self.store.segment_below(queue.group, cursor)

    def _snapshot_below_live(self, queue: QuorumQueue, cursor: int, index: int) -> None:
        """In a cluster a snapshot must not cover a live message. A follower that
        installs it gets no entries below it. And the message body lives only in the
        log. So the machine's state at `index` is kept as a candidate until every live
        message is above it (the cursor passed it). RabbitMQ 3's release-cursor
        queue does the same. The newest candidate the cursor passed is then taken.
        At most three candidates wait; a newer one replaces the last."""
        candidates = queue.snapshot_candidates
        data = queue.snapshot()
        if len(candidates) < 3:
            candidates.append((index, data))
        else:
            candidates[-1] = (index, data)
        usable = [c for c in candidates if c[0] < cursor]
        if usable:
            queue.pending_snapshot = (cursor, *usable[-1])
            queue.snapshot_candidates = [c for c in candidates if c[0] > usable[-1][0]]

    def _is_stale(self, identity: str) -> bool:
        """A connection of an earlier run of this node. In a group of one, every
        recorded one is. In a cluster, other nodes' connections are theirs to
        report."""
        return self.cluster.is_stale_identity(identity)

    def _after_apply(self, queue: QuorumQueue, leading: bool) -> None:
        """What follows applying a Ready of `queue` (`leading`: this member leads)."""
        self._ensure_worker(queue, leading)
        state = queue.state
        if (state.config.expires is not None or state.normal.expiries is not None
                or state.high.expiries is not None or state.returns.expiries is not None
                ) and leading and not queue.deleted:
            self._wake_for_expiry(queue)  # something of it is timed (checked first: no call)
        if queue.replay_until and queue.raft.applied_index >= queue.replay_until:
            queue.replay_until = 0
            # as the leader: first suspect the consumers of the nodes not heard from
            # (a restart after every node was killed), so that none of them is made
            # active or served while this node's own earlier consumers go
            self.cluster.check_consumer_nodes(queue)
            stale = {c.connection for c in queue.state.consumers.values()
                     if self._is_stale(c.connection)}
            for command in stale_downs(queue.state, stale):
                queue.propose(command, 0)
        if queue.pending_snapshot is not None:
            cursor, index, data = queue.pending_snapshot
            queue.pending_snapshot = None
            if queue.raft.log.unstable_snapshot() is not None:
                # the leader's snapshot arrived while these entries applied (a follower
                # cut off, far behind): it covers them and replaces this state and the
                # log at the next Ready, so no snapshot or release of this state's own
                return
            current = self.store.snapshot_meta(queue.group)
            try:
                if current is None or index > current.index:
                    meta = queue.raft.compact(index)
                    self.store.write_snapshot(queue.group, meta, data)
                cursor = min(cursor, index + 1)
                self.store.release(queue.group, cursor)
                if self.snapshot_over_live:  # else nothing live is below the snapshot
                    self._maybe_compact(queue, cursor, index)
            except OSError as error:
                if not is_disk_full(error):
                    raise
                # the log keeps what the snapshot would have let go: a later release
                # cursor takes one when there is room (the files are as before)
                log.warning("quorum queue '%s' in vhost '%s': snapshot at %d postponed: "
                            "%s", queue.name, queue.vhost, index, error)

    def _maybe_compact(self, queue: QuorumQueue, cursor: int, index: int) -> None:
        """One long-lived message pins the log from its index on: the release cursor
        cannot pass it. So compact, as RabbitMQ 4.3 does. Once two segments' worth of
        entries between the cursor and the snapshot are dead beyond what the last
        compaction saw, rewrite the segments below the snapshot. They then hold only
        live entries."""
        live = live_indexes(queue.state)
        pending = queue.applied.pending_indexes()
        if pending:  # kept as a message is: read back when its turn comes
            live = array("Q", sorted([*live, *pending]))
        below = bisect_right(live, index)
        dead = (index + 1 - cursor) - below
        queue.compacted_dead = min(queue.compacted_dead, dead)  # the cursor moved on
        if dead - queue.compacted_dead < 2 * self.store.config.segment_max_entries:
            return
        queue.compacted_dead = dead
        if self.store.segment_paths(queue.group):
            self.store.compact(queue.group, live)

    # ------------------------------------------------------------ deliveries

    def read_message(self, queue: QuorumQueue, index: int) -> tuple[str, str, bytes, bytes]:
        """(exchange, routing key, content header, body) of the message at `index`."""
        return deliveries.read_message(self.store, queue, index)

    def read_dead_letter(self, queue: QuorumQueue, index: int) -> tuple:
        """`read_message` and the message's BCC keys (deliveries.py)."""
        return deliveries.read_dead_letter(self.store, queue, index)

    def read_message_spans(self, queue: QuorumQueue, indexes: list[int]) -> list[tuple]:
        """The messages at `indexes` (increasing) as views into their log entries
        (deliveries.py)."""
        return deliveries.read_message_spans(self.store, queue, indexes)

    def read_entries(self, queue: QuorumQueue, indexes) -> list[bytes]:
        """The whole log entries of the messages at `indexes` (deliveries.py)."""
        return deliveries.read_entries(self.store, queue, indexes)

    # ------------------------------------------------------------ dead lettering

    def _dead_letter(self, queue: QuorumQueue, index: int, reason: str) -> None:
        """At-most-once dead lettering (the quorum queues guide, "Dead Lettering").
        The leader that applied the drop publishes a copy with x-death headers. It
        goes through the queue's dead-letter exchange (node/dead_letters.py, as
        classic queues do). Fire and forget: no confirm is awaited. A leader that dies
        first loses it."""
        node = self.host
        if not node.dead_letters_to(queue):
            return
        try:
            source, routing_key, header, body, blind_keys = self.read_dead_letter(queue, index)
        except MessageGone as error:
            log.warning("quorum queue '%s' in vhost '%s': message %s (%s) not dead-lettered: "
                        "%s", queue.name, queue.vhost, index, reason, error)
            return
        node.dead_letter_copy(queue, source, routing_key, header, body, reason,
                              queue.last_time_ms, blind_keys)

    def _ensure_worker(self, queue: QuorumQueue, leading: bool) -> None:
        """At-least-once dead lettering: the leader runs the queue's dead-letter
        worker (queues/quorum/dead_letter_worker.py). There is one per leader term and
        node run. A DlxCheckout registers it in the machine. A member that no longer
        leads stops it; so does a queue that left at-least-once."""
        worker = self.dlx_workers.get(queue.group)
        wanted = (leading and not queue.replay_until
                  and queue.state.config.dead_letter_at_least_once)
        if not wanted:
            if worker is not None:
                self._stop_worker(queue)
            return
        identity = f"{self.member}/{self.host.boot_id}/{queue.raft.term}"
        if worker is None or worker.identity != identity:
            if worker is not None:
                worker.stop()
            worker = DeadLetterWorker(self, queue, identity, self.dead_letter_prefetch,
                                      self.dead_letter_confirm_timeout_ms)
            self.dlx_workers[queue.group] = worker
        consumer = queue.state.dlx.consumer
        if (consumer is None or consumer.worker != identity) and not worker.checkout_proposed:
            worker.checkout_proposed = True

            def registered(_reply, worker=worker) -> None:
                worker.checkout_proposed = False

            queue.propose(commands.DlxCheckout(identity, worker.prefetch), 0, registered)

    def _stop_worker(self, queue: QuorumQueue) -> None:
        worker = self.dlx_workers.pop(queue.group, None)
        if worker is not None:
            worker.stop()

    def _delete_expired(self, queue: QuorumQueue, unused_ms: int) -> None:
        """Queue TTL (x-expires): the leader asks the metadata group to delete the
        queue, as a client's queue.delete would. So every node drops its record, and
        every member its replica. RabbitMQ's quorum queue leader does the same."""
        from ...groups import metadata as meta

        queue.expiry_proposed = True
        log.info("quorum queue '%s' in vhost '%s': unused for %d ms (x-expires %d): "
                 "deleting it", queue.name, queue.vhost, unused_ms,
                 queue.state.config.expires)
        self.cluster.meta.propose_data(
            meta.encode("queue.delete", vhost=queue.vhost, name=queue.name,
                        group=queue.group), None)

    # ------------------------------------------------------------ time

    def _watch(self, queue: QuorumQueue, leading: bool) -> None:
        """After one of its Readies: put the queue in the timers' sets it now needs
        (the timers drop it once it needs them no more)."""
        group = queue.group
        if self._timed(queue, leading):
            self.timed[group] = None
        if leading:
            if queue.state.consumers or queue.node_proposals:
                self.watched[group] = None
            if queue.policy_term != queue.raft.term:
                self.policy_due[group] = None
            self.membership_due[(queue.vhost, queue.name)] = None
        elif self.member not in queue.members:
            self.membership_due[(queue.vhost, queue.name)] = None

    def _timed(self, queue: QuorumQueue, leading: bool) -> bool:
        """Whether `tick_queue` has anything to do for it: it runs a dead-letter
        worker, or it leads and has x-expires, messages that expire, leases with
        timeouts holding messages, at-least-once dead lettering, or forwards held
        for a gap (given up by a Tick's time: raft/forwarded.py HOLD_MS)."""
        if queue.group in self.dlx_workers:
            return True
        if queue.deleted or not leading:
            return False
        state = queue.state
        config = state.config
        return (config.expires is not None or config.dead_letter_at_least_once
                or queue.applied.give_up_ms != NEVER
                or state.normal.expiries is not None or state.high.expiries is not None
                or state.returns.expiries is not None
                or any(lease.timeout_ms and lease.indexes
                       for lease in state.leases.values()))

    def members_of(self, keys: dict[str, None], wanted) -> list[ReplicatedGroup]:
        """The groups of `keys` (one of the timers' sets) for which `wanted(group)`
        holds; the others leave `keys` (unknown ones too)."""
        queues = self.queues
        found = []
        for key in list(keys):
            member = queues.get(key)
            if member is not None and wanted(member):
                found.append(member)
            else:
                del keys[key]
        return found

    def raft_tick(self) -> None:
        """One Raft tick for the groups whose core needs one (elections, heartbeats):
        the server calls it every `raft.tick_interval_ms`. A group of one that leads
        is not ticked (RaftNode.needs_tick) until an input wakes it."""
        for member in self.members_of(self.ticking, _needs_tick):
            member.raft.tick()

    def member_lost(self, node: str) -> None:
        """The cluster's failure detector found `node` down: the quiet followers of
        the leaders there start their election timers, and the quiet leaders counting
        a member there check their quorum again (RaftNode.member_lost). Visits every
        group once per such finding, never per tick."""
        ticking = self.ticking
        for uid, member in self.queues.items():
            raft = member.raft
            if raft is not None and not raft.needs_tick and node in raft.members:
                raft.member_lost(node)
                ticking[uid] = None

    def tick(self, now: int) -> None:
        """Called by the server about twice a second. A Tick command releases
        leases idle past their timeout. It also removes (or dead-letters) expired
        messages at the heads of the ready queues. The Tick goes through the log, so
        every replica agrees. The leader's `now` is in the entry. Only the queues
        with something timed (`timed`) are visited."""
        for worker in list(self.dlx_workers.values()):
            worker.tick(now)
        for queue in self.members_of(self.timed, self._timed_queue):
            self.tick_queue(queue, now)

    def _timed_queue(self, member) -> bool:
        return isinstance(member, QuorumQueue) and self._timed(member, member.is_leader)

    def tick_queue(self, queue: QuorumQueue, now: int) -> None:
        """The leader proposes a Tick in these cases. A head's message expired, or
        the queue has been unused for its x-expires period. Or leases with a timeout
        hold messages. Or forwards have waited HOLD_MS for a gap of their node
        (raft/forwarded.py): the Tick's time gives it up on every member. It proposes at once when no Tick proposed since covers that
        moment (RabbitMQ's expire_msgs timer). Else at most once per
        `tick_interval_ms`: a Tick lost to a leader change."""
        if not queue.is_leader:
            return  # the leader proposes time; the others apply it
        if not queue.deleted:
            self._ensure_worker(queue, True)
        expiry = next_expiry(queue.state)
        unused_until = queue_expiry(queue.state)
        if unused_until is not None and queue.expiry_proposed:
            unused_until = None
        # forwards held for a gap since HOLD_MS ago: a Tick stamped now gives it up
        held = queue.applied.give_up_ms
        held_until = None if held == NEVER else held
        last = queue.last_tick_ms
        uncovered = any(moment is not None and last < moment <= now
                        for moment in (expiry, unused_until, held_until))
        if not uncovered and now - last < self.tick_interval_ms:
            self._wake_for_expiry(queue)
            return
        if (expiry is not None and expiry <= now) or (
                unused_until is not None and unused_until <= now) or (
                held_until is not None and held_until <= now) or any(
                lease.timeout_ms and len(lease.indexes)
                for lease in queue.state.leases.values()):
            queue.last_tick_ms = now
            queue.propose(commands.Tick(), now)
        else:
            self._wake_for_expiry(queue)

    def _wake_for_expiry(self, queue: QuorumQueue) -> None:
        """Have the node wake this leader when its next message or the queue itself
        expires (queues/deadlines.py)."""
        moments = [moment for moment in (next_expiry(queue.state), queue_expiry(queue.state))
                   if moment]
        if moments:
            self.deadlines.add(min(moments), queue,
                               lambda now, queue=queue: self.tick_queue(queue, now))


def _needs_tick(member) -> bool:
    raft = member.raft
    return raft is not None and raft.needs_tick


def _store_run(queue: QuorumQueue, entries, position: int, index: int) -> tuple[int, int]:
    """The entries from `position` on that fifo/in_place.py stores in one run
    (`enqueue_run_in_place`), after the entry at `index` it stored "ok", with
    their waiters answered "ok": what `_apply_entries` does for each in turn
    (twin: tests/broker/queues/test_twins.py). The run stays below the entry
    that gives up a forwarded gap, and, with waiters, below an entry of a newer
    term (`entry_committed`). Returns (the next position, the index applied
    last)."""
    applied = queue.applied
    if applied.give_up_ms != NEVER:
        return position, index
    stop = min(len(entries), position + applied.give_up_at - 1 - index)
    waiters = queue.waiters
    end, time_ms = enqueue_run_in_place(queue.state, entries, position, stop, COMMAND,
                                        queue.applied_term if waiters else _NO_TERM)
    if end == position:
        return position, index
    queue.last_time_ms = time_ms
    last = entries[end - 1].index
    if waiters:  # twin of the loop's answer to a lone waiter, else take_waiters
        first = index + 1
        due = (sorted(i for i in waiters if first <= i <= last)
               if len(waiters) < end - position else range(first, last + 1))
        for at in due:
            waiting = waiters.pop(at, None)
            if waiting:
                term = entries[position + at - first].term
                if len(waiting) == 1 and waiting[0][0] in (term, None):
                    waiting[0][2]("ok")
                else:
                    waiters[at] = waiting
                    for callback in queue.take_waiters(at, term):
                        callback("ok")
    return end, last


def _deliver_held(groups: QuorumGroups, queue: QuorumQueue, held: dict[str, list]) -> None:
    """The held batches of `QuorumGroups._apply_entries` to their consumers, each in
    the machine's order, consumers in the order of their first delivery; `held` is
    emptied."""
    for key, batch in held.items():
        carry_out(deliveries.deliver(groups, queue, key, batch))
    held.clear()
