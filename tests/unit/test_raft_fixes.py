"""Regression tests for three Raft fixes: a live follower left behind the leader's retention
is reset (not stalled), the bytes queued to a peer that does not read stay bounded, and a
leader's read lease ends before anyone else can be elected."""

import asyncio
import socket
import time

import pytest
import uvloop

from broker.protocol.frame import HEADER_SIZE, FrameDecoder
from replication.raft import messages as m
from replication.raft import transport, wire
from replication.raft.progress import State
from replication.raft.transport import PeerLink

from .raft_harness import Group


def write(g, leader, n, tag="w"):
    for k in range(n):
        g.append(leader, b"%s%d" % (tag.encode(), k))
    g.deliver()


def drop_head(log, n):
    """What retention does to a MemLog: the first `n` entries are gone."""
    log.items, log.begin = log.items[n:], log.begin + n


# --- a live follower behind the leader's retention -------------------------------------------


def test_live_follower_behind_the_leaders_retention_is_reset_not_stalled():
    """The follower misses pushes for less than an election timeout, so it never campaigns
    or restarts and asks for no probe; the leader's pushes time out (it goes back to the
    watermark, below its first retained entry). It must probe and reset the follower there."""
    seed = 0
    print("seed", seed)
    g = Group(3, seed=seed, push_timeout_ticks=4)
    lead = g.until_leader()
    write(g, lead, 3)
    g.tick(5)
    lag = next(i for i in g.ids if i != lead)
    other = next(i for i in g.ids if i not in (lead, lag))
    g.isolate(lag)
    write(g, lead, 20, "more")
    g.tick(6)  # shorter than any election timeout (10..19): the lagger stays a quiet follower
    assert g.leader() == lead and g.nodes[lag].leader_id == lead
    assert g.nodes[lead].leading.progress[lag].state == State.APPEND
    for i in (lead, other):  # retention deleted what the lagger needs next, on both
        drop_head(g.logs[i], 10)
    begin = g.logs[lead].begin
    assert g.logs[lag].last_index() < begin - 1
    g.heal()
    g.tick(60)
    assert g.leader() == lead
    assert g.logs[lag].begin == begin and g.datas(lag) == g.datas(lead)
    assert g.nodes[lag].commit_index == g.logs[lead].last_index()
    assert g.nodes[lead].leading.progress[lag].watermark == g.logs[lead].last_index()
    truncs = g.pushes_to(lag, m.PushType.RESET)
    assert truncs and truncs[-1].entries[0][0] == begin, "reset at the leader's first retained entry"


# --- the read lease ends before another node can be elected ----------------------------------


def lease_margin(g):
    from replication.raft.leader import lease_margin_ticks
    return lease_margin_ticks(g.cfg["election_ticks"])


def steady(seed, n=3, **cfg):
    g = Group(n, seed=seed, **cfg)
    lead = g.until_leader()
    write(g, lead, 3)
    g.tick(7)
    assert g.nodes[lead].read_lease_held
    return g, lead


def earliest_election_tick(g, old):
    """No node votes (nor pre-votes) while it heard a leader within election_ticks, nor
    campaigns sooner: a new leader needs a majority of the others past that point."""
    e = g.cfg["election_ticks"]
    need = len(g.ids) // 2 + 1
    return sorted(g.nodes[i].heard_leader_tick + e for i in g.ids if i != old)[need - 1]


def test_a_leader_cut_off_from_its_quorum_stops_serving_reads_before_a_new_leader_can_exist():
    for seed in range(20):
        g, old = steady(seed, n=3 + 2 * (seed % 2))
        g.isolate(old)
        cut_at = g.nodes[old].now
        earliest = earliest_election_tick(g, old)
        last_read, new_at = None, None
        while new_at is None:
            assert g.nodes[old].now < cut_at + 100, f"seed {seed}: no new leader"
            if g.nodes[old].read_lease_held:
                last_read = g.nodes[old].now
            g.tick()
            if any(g.nodes[i].is_leader for i in g.ids if i != old):
                new_at = g.nodes[old].now
        print(f"seed {seed}: cut at {cut_at}, last read served at {last_read}, "
              f"earliest election {earliest}, new leader at {new_at}")
        assert earliest <= new_at, f"seed {seed}: the bound itself is wrong"
        assert last_read is not None and last_read < earliest - lease_margin(g) + 1, f"seed {seed}"


def test_the_lease_counts_from_when_the_heartbeat_was_sent_not_when_its_answer_came():
    seed = 3
    print("seed", seed)
    g, lead = steady(seed)
    node = g.nodes[lead]
    hb = g.cfg["heartbeat_ticks"]
    while node.leading._since_heartbeat != hb - 1:
        g.tick()
    for i in g.ids:  # one tick in which the leader sends a heartbeat, nothing delivered yet
        g.nodes[i].tick()
        g.process(i)
    sent_at = node.now
    to_followers = [q for q in g.queue if q[0] == lead]
    g.queue.clear()
    for src, to, msg in to_followers:
        g.nodes[to].step(msg)
        g.process(to)
    held = [q for q in g.queue if q[1] == lead]  # their answers: held back
    g.queue.clear()
    assert held and all(isinstance(q[2], m.PushResponse) for q in held)
    g.isolate(lead)  # nothing newer reaches or leaves it
    delay = 5
    for _ in range(delay):
        g.tick()
    for src, to, msg in held:  # the answers arrive `delay` ticks late
        node.step(msg)
        g.process(lead)
    end = sent_at + g.cfg["election_ticks"] - lease_margin(g)
    assert node.leading.lease_end_tick() == end  # not arrival + election_ticks
    while node.now < end - 1:
        g.tick()
        assert node.read_lease_held
    g.tick()
    assert node.now == end and not node.read_lease_held


class CheckedGroup(Group):
    """After every step: no node serves reads under its lease while another node leads a
    newer term."""

    def process(self, i):
        super().process(i)
        for a in self.ids:
            na = self.nodes[a]
            if a in self.down or not na.read_lease_held:
                continue
            for b in self.ids:
                nb = self.nodes[b]
                assert not (b not in self.down and nb.is_leader and nb.term > na.term), \
                    f"{a} (term {na.term}) serves reads while {b} leads term {nb.term}"


def test_no_read_lease_overlaps_a_newer_leader_under_partitions_transfers_and_restarts():
    import random
    for seed in range(30):
        rng = random.Random(seed)
        n = rng.choice((3, 5))
        print("seed", seed, "nodes", n)
        g = CheckedGroup(n, seed=seed)
        g.until_leader()
        for step in range(40):
            up = [i for i in g.ids if i not in g.down and g.nodes[i].is_leader]
            lead = max(up, key=lambda i: g.nodes[i].term) if up else None  # a deposed one may not know yet
            what = rng.random()
            if lead and what < 0.15:
                g.isolate(lead)
            elif what < 0.35:
                g.heal()
            elif lead and what < 0.5:
                g.nodes[lead].transfer_leader(rng.choice([i for i in g.ids if i != lead]))
                g.process(lead)
            elif what < 0.6 and not g.down:
                victim = rng.choice(g.ids)
                g.crash(victim)
                g.tick(rng.randrange(1, 8))
                g.restart(victim)
            elif lead:
                g.append(lead, b"x%d" % step)
            g.tick(rng.randrange(1, 15))
        g.heal()
        g.tick(120)
        assert g.leader() is not None, f"seed {seed}: no leader at the end"


def test_no_lease_once_timeout_now_is_sent_and_back_when_its_target_answers_a_later_push():
    seed = 1
    print("seed", seed)
    g, lead = steady(seed)
    target = next(i for i in g.ids if i != lead)
    assert g.nodes[lead].transfer_leader(target) is None
    g.process(lead)
    assert any(isinstance(q[2], m.TimeoutNow) for q in g.queue)
    assert not g.nodes[lead].read_lease_held  # the target may win at once: no lease vote to wait for
    g.deliver()
    assert g.leader() == target

    g, lead = steady(seed)  # the same, but the TimeoutNow is lost: the transfer times out
    target = next(i for i in g.ids if i != lead)
    assert g.nodes[lead].transfer_leader(target) is None
    g.process(lead)
    g.queue = [q for q in g.queue if not isinstance(q[2], m.TimeoutNow)]
    assert not g.nodes[lead].read_lease_held
    while g.nodes[lead].leading.transfer is not None:
        g.tick()
        assert g.leader() == lead
    g.tick(g.cfg["heartbeat_ticks"] + 1)  # the target answers a heartbeat sent after it
    assert g.nodes[lead].read_lease_held


def test_a_restarted_voter_does_not_vote_inside_a_lease_it_may_have_granted():
    """5 nodes, leader L: d and e are cut off from L (and campaign in vain); b answers L,
    crashes, restarts at once and is cut off from L too. L's lease counts on b's answers
    from before the crash; b must not help d or e win before that lease ends."""
    for seed in range(12):
        print("seed", seed)
        g = CheckedGroup(5, seed=seed)
        lead = g.until_leader()
        write(g, lead, 2)
        g.tick(7)
        b, c, d, e = [i for i in g.ids if i != lead]
        g.cut |= {frozenset((lead, d)), frozenset((lead, e))}
        g.tick(g.cfg["election_ticks"] + seed % 5)
        assert g.nodes[lead].read_lease_held
        g.crash(b)
        g.restart(b)
        g.cut.add(frozenset((lead, b)))
        g.tick(3 * g.cfg["election_ticks"])  # CheckedGroup checks every step


# --- the bytes queued to a peer that does not read stay bounded -------------------------------


class PeerReader(asyncio.Protocol):
    """The far end of a leader's link once it reads: frames -> raft messages."""

    def __init__(self, deliver):
        self.deliver = deliver
        self.decoder = FrameDecoder(1 << 24)

    def data_received(self, data):
        for f in self.decoder.feed(data):
            self.deliver(wire.decode(f.body))


class PeerServer:
    """A real socket server for a follower that is paused: it accepts connections but reads
    nothing (SO_RCVBUF 4 KiB) until `resume`."""

    def __init__(self, deliver):
        self.deliver = deliver
        self.reading = False
        self.held: list[socket.socket] = []  # accepted, not read
        self.accepted = 0

    async def start(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # accepted ones inherit it
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.setblocking(False)
        self.task = asyncio.ensure_future(self._accept())
        return self.sock.getsockname()[1]

    async def _accept(self):
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.sock)
            self.accepted += 1
            if self.reading:
                await loop.connect_accepted_socket(lambda: PeerReader(self.deliver), conn)
            else:
                self.held.append(conn)

    async def resume(self):
        self.reading = True
        loop = asyncio.get_running_loop()
        for conn in self.held:
            await loop.connect_accepted_socket(lambda: PeerReader(self.deliver), conn)
        self.held.clear()

    def close(self):
        self.task.cancel()
        self.sock.close()


class LinkedGroup(Group):
    """The harness group, but what the leader sends to `remote` goes over a real PeerLink."""

    link = None
    remote = None

    def process(self, i):
        super().process(i)
        if self.link is not None:
            for q in [q for q in self.queue if q[1] == self.remote]:
                self.queue.remove(q)
                self.link.send(q[2])


def link_queued(link):
    """What the leader's side holds for the peer in user space: the transport's write
    buffer and the frames not flushed yet."""
    conn = link.conn
    if conn is None or conn.closed:
        return 0
    return conn.transport.get_write_buffer_size() + sum(map(len, conn._out))


@pytest.mark.parametrize("stall_reconnect", [False, True])
def test_a_peer_that_does_not_read_gets_a_bounded_queue_then_catches_up(stall_reconnect):
    seed, bound, payload = 5, 64 << 10, 2000
    print("seed", seed)
    g = LinkedGroup(3, seed=seed, push_timeout_ticks=4, push_batch_bytes_max=16 << 10)
    lead = g.until_leader()
    write(g, lead, 3)
    g.tick(7)
    remote = next(i for i in g.ids if i != lead)

    def deliver(msg):
        if remote not in g.down:
            g.nodes[remote].step(msg)
            g.process(remote)

    async def scenario():
        server = PeerServer(deliver)
        port = await server.start()
        link = PeerLink(remote, f"127.0.0.1:{port}", 1 << 24)
        link.queued_bytes_max = bound  # (the old PeerLink had no such bound: ignored there)
        link.stall_reconnect_s = 0.3 if stall_reconnect else 1000.0
        link.send(m.Heartbeat(lead, g.nodes[lead].term, -1))  # opens the connection
        while link.conn is None:
            await asyncio.sleep(0.01)
        link.conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        g.link, g.remote = link, remote
        g.down.add(remote)  # paused: it neither reads nor ticks
        offered, peak = 0, 0
        real_send = link.send

        def counting_send(msg):
            nonlocal offered
            offered += sum(map(len, wire.encode_parts(msg)))
            real_send(msg)
        link.send = counting_send
        # 300 pushes at least; with stall_reconnect, on until the stalled link has reconnected
        # once (stall_reconnect_s of wall time: a loaded machine takes longer), within a bound
        k, deadline = 0, time.monotonic() + 20
        while k < 300 or (stall_reconnect and link.stall_reconnects < 1 and time.monotonic() < deadline):
            g.append(lead, bytes([k % 256]) * payload)
            g.tick()
            await asyncio.sleep(0.001 if stall_reconnect else 0)  # the connection flushes
            peak = max(peak, link_queued(link))
            k += 1
        print(f"offered {offered} bytes to the paused peer, peak queued {peak}, bound {bound}, "
              f"overflowed {getattr(link, 'overflowed', None)}, "
              f"repeats skipped {getattr(link, 'repeats_skipped', None)}, "
              f"reconnects {getattr(link, 'stall_reconnects', None)}")
        assert offered > 10 * bound  # the leader kept pushing and resending
        assert peak <= bound + (16 << 10) + 4096, "the queue to a peer that does not read grew"
        if stall_reconnect:
            assert link.stall_reconnects >= 1
        g.down.discard(remote)
        await server.resume()
        deadline = time.monotonic() + 20
        while g.datas(remote) != g.datas(lead) or g.nodes[remote].commit_index != g.logs[lead].last_index():
            assert time.monotonic() < deadline, "the peer did not catch up once it read again"
            g.tick()
            await asyncio.sleep(0.002)
        assert g.leader() == lead
        link.close()
        server.close()

    uvloop.run(scenario())


def test_a_probe_overtaken_by_a_heartbeat_commit_push_is_still_answered():
    """Heartbeats are COMMIT pushes now: one that overtakes a COMPARE (a reordering network)
    must not make the COMPARE look like a late copy (it changes no log)."""
    g = Group(3, seed=2)
    lead = g.until_leader()
    write(g, lead, 3)
    g.tick(5)
    f = next(i for i in g.ids if i != lead)
    node, term, end = g.nodes[f], g.nodes[lead].term, g.logs[f].last_index()
    node.step(m.Push(lead, term, m.PushType.COMMIT, end, (), seq=10_001))
    node.ready()
    node.step(m.Push(lead, term, m.PushType.COMPARE, end, ((end, term, b""),), seq=10_000))
    answers = [msg for _, msg in node.ready().messages if isinstance(msg, m.PushResponse)]
    assert [(a.type, a.code, a.seq) for a in answers] == [(m.PushType.COMPARE, m.PushCode.SUCCESS, 10_000)]


def test_a_peer_link_reports_each_new_connection_and_sends_what_waited_for_it():
    """The raft driver resends to a peer as soon as its link connects (LeaderSide.link_up):
    the link reports every new connection, the first and each one after a drop. What was sent
    while it had none goes out first on the new one, in order (a restarted follower's first
    answers were dropped, which cost the leader a push timeout, 1 s, before it asked again);
    when the attempt fails it is dropped."""
    async def until(cond, what):
        deadline = time.monotonic() + 10
        while not cond():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.01)

    async def scenario():
        got = []
        server = PeerServer(got.append)
        port = await server.start()
        await server.resume()  # it reads
        seen = []
        link = PeerLink("b", f"127.0.0.1:{port}", 1 << 20, on_connected=seen.append)
        link.send(m.Heartbeat("a", 1, 1))  # no connection yet: it waits, and one is opened
        link.send(m.Heartbeat("a", 1, 2))
        await until(lambda: seen, "no connection reported")
        link.send(m.Heartbeat("a", 1, 3))
        await until(lambda: len(got) == 3, f"received {got}")
        assert seen == ["b"] and link.dropped == 0
        assert [x.commit_index for x in got] == [1, 2, 3]
        link._drop_connection()  # (what a stalled link does)
        link.send(m.Heartbeat("a", 1, 4))
        await until(lambda: len(seen) == 2, "no second connection reported")
        await until(lambda: len(got) == 4, f"received {got}")
        assert seen == ["b", "b"] and link.dropped == 0 and got[-1].commit_index == 4
        link.close()
        server.close()

        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        dead_port = free.getsockname()[1]
        free.close()  # nothing listens there
        dead = PeerLink("c", f"127.0.0.1:{dead_port}", 1 << 20, on_connected=seen.append)
        dead.send(m.Heartbeat("a", 1, 5))
        dead.send(m.Heartbeat("a", 1, 6))
        await until(lambda: dead.dropped == 2, f"dropped {dead.dropped}")
        assert dead._held == [] and dead._held_bytes == 0 and seen == ["b", "b"]
        dead.close()

    uvloop.run(scenario())


def test_a_peer_link_holds_at_most_held_bytes_max_while_it_connects(monkeypatch):
    """What waits for a connection stays within HELD_BYTES_MAX: a message that would pass it
    is dropped (and counted) -- unless nothing waits yet (a window's start bigger than the
    bound alone still waits, else it would cost the leader a push timeout)."""
    one = sum(map(len, wire.encode_parts(m.Heartbeat("a", 1, 7))))
    monkeypatch.setattr(transport, "HELD_BYTES_MAX", 2 * one + one // 2)

    async def scenario():
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()  # nothing listens there: every send below waits for a connection
        link = PeerLink("d", f"127.0.0.1:{port}", 1 << 20)
        for _ in range(3):
            link.send(m.Heartbeat("a", 1, 7))
        assert (link._held_bytes, len(link._held), link.dropped) == (2 * one, 2, 1)
        link.close()
        monkeypatch.setattr(transport, "HELD_BYTES_MAX", one // 2)
        big = PeerLink("e", f"127.0.0.1:{port}", 1 << 20)
        big.send(m.Heartbeat("a", 1, 7))  # alone and over the bound: it waits
        big.send(m.Heartbeat("a", 1, 8))
        assert (big._held_bytes, len(big._held), big.dropped) == (one, 1, 1)
        big.close()

    uvloop.run(scenario())


def test_what_waits_for_a_connection_stays_within_the_links_queue_bound():
    """A link's queue bound holds for what waits for a connection too: those messages are all
    queued on the connection once it opens. CI caught a reconnected link to a peer that did
    not read queueing 507 KiB over a 64 KiB bound: what was sent while it reconnected was
    held against HELD_BYTES_MAX (1 MiB) alone."""
    bound, payload = 64 << 10, 2000
    msgs = [m.Push("a", 1, m.PushType.APPEND, k, ((k + 1, 1, bytes([k % 256]) * payload),)) for k in range(400)]
    sizes = [sum(map(len, wire.encode_parts(x))) for x in msgs]

    async def scenario():
        server = PeerServer(lambda msg: None)  # accepts, reads nothing
        port = await server.start()
        link = PeerLink("b", f"127.0.0.1:{port}", 1 << 24, queued_bytes_max=bound)
        for x in msgs:  # all before the connection opens: nothing here awaits
            link.send(x)
        kept, held = len(msgs) - link.dropped, link._held_bytes
        assert link.conn is None and held == sum(sizes[:kept]) <= bound  # the first ones, in order
        deadline = time.monotonic() + 10
        while link.conn is None:
            assert time.monotonic() < deadline, "the link did not connect"
            await asyncio.sleep(0.01)
        print(f"offered {sum(sizes)} bytes while connecting, {kept} messages kept, "
              f"{link.conn.queued_total} bytes queued on the connection, bound {bound}")
        assert link.conn.queued_total == held + kept * HEADER_SIZE  # each in a frame
        link.close()
        server.close()

    uvloop.run(scenario())
