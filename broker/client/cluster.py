"""Clients of a cluster of broker groups found through name servers (issue 16;
docs/design/name-server.md sections 5-8).

`ClusterProducer(namesrv)` and `ClusterConsumer(namesrv, group, topic)` ask any name server
for a topic's route (GET_TOPIC_ROUTE: every group holding it, its queues, its leader and
followers) and talk to each group through today's one-group clients, built per group with
the group's addresses (leader first). Nothing on the data path goes through a name server:
with every name server down, known routes keep working (broker/client/routes.py never drops
a route on a failed fetch) and a topic with no known route fails with NameServerUnavailable.

Producer: queues are chosen over all writable queues of all groups, round robin per topic,
sticky per loop pass (one batch per pass, KIP-480). Within a group the one-group Producer does
what it always did (batches, NOT_LEADER following, retries with the same msg_id). A send that
certainly stored nothing (stored=False: the group refused it, or every address refused the
connection) is retried on a queue of another group (RocketMQ's lastBrokerName rule) while
retries are left; so is one whose outcome stayed unknown after its group's own retries (the
group died with it in flight), with the same msg_id, unless retry_when_outcome_unknown is off:
its result then says possible_duplicate, and the duplicate, if any, is in another group's
queue (consumers dedupe by msg_id, as for any retry). Results carry `broker_name`, and
`attempts` counts every group's. Routes are refreshed every `route_refresh_interval_ms` and
at once when a send to a group fails. A topic no group holds is auto-created through the
name servers' template route when the producer allows it (on by default) and some group's
brokers do (broker/client/namesrv_client.py; docs/design/name-server.md section 7).

Consumer: one one-group Consumer per group holding the topic; each balances that group's
queues among the consumer group's members (AllocateMessageQueueAveragely per group: every
(group, queue) has exactly one owner; RocketMQ balances the union, which can be one queue
more even). Messages carry `broker_name`; offsets are committed to each queue's own group.
"""

from __future__ import annotations

import asyncio
import logging
import time

from broker.client.base import ClientBase
from broker.client.connection import parse_bootstrap
from broker.client.consumer import Consumer, Message
from broker.client.errors import BrokerError, SendError, TidelogError
from broker.client.namesrv_client import (DEFAULT_TOPIC_QUEUES, ROUTE_REFRESH_INTERVAL_MS,
                                          ROUTE_REFRESH_MIN_INTERVAL_MS, NameServers,
                                          NameServerUnavailable, RouteCache, _Routes)
from broker.client.outcomes import MessageIds, ProducerBufferFull
from broker.client.producer import Producer, SendResult
from broker.protocol.codes import Code

__all__ = ["ClusterConsumer", "ClusterProducer", "NameServerUnavailable", "NameServers", "RouteCache",
           "create_topic", "DEFAULT_TOPIC_QUEUES", "ROUTE_REFRESH_INTERVAL_MS",
           "ROUTE_REFRESH_MIN_INTERVAL_MS",
           "_Routes"]  # the name-server parts live in namesrv_client.py, and are still importable here

log = logging.getLogger(__name__)


def _fail(out: asyncio.Future, e: Exception, tried: tuple) -> None:
    """Settle `out` with `e`, counting the attempts made in other groups before (tried[0]); if
    one of them may have stored the message (tried[1]), a later refusal cannot say it was not."""
    if out.done():
        return
    before, maybe = tried
    if isinstance(e, SendError) and before:
        e.attempts += before
        if maybe and e.stored is False:
            e.stored = None
    out.set_exception(e)


class ClusterProducer(ClientBase):
    """Sends over every group of a topic (see the module docstring). Keyword arguments other
    than the ones below go to each group's Producer (timeouts, batching, credentials...).

    auto_create_topic_enable: a topic no group holds borrows the route of the groups whose
    brokers create topics on first send (the name servers' template route,
    broker/client/namesrv_client.py), with min(default_topic_queues, theirs) queues per group;
    on by default, as RocketMQ's DefaultMQProducer and the one-group Producer (whose broker
    answers GET_ROUTE with its template): whether topics get created is the brokers' choice
    (their auto_create_topic_enable) and their ACLs' (pub on the topic). Off: such a send fails
    TOPIC_NOT_EXIST at once (a misspelt topic never creates one)."""

    def __init__(self, namesrv, *, route_refresh_interval_ms: int = ROUTE_REFRESH_INTERVAL_MS,
                 send_latency_fault_enable: bool = False, retry_times_when_send_failed: int = 2,
                 auto_create_topic_enable: bool = True, default_topic_queues: int = DEFAULT_TOPIC_QUEUES,
                 names=None, **kw):
        """names: where routes come from instead of the name servers at `namesrv` (then the
        brokers' addresses): multigroup.BootstrapRoutes."""
        auth = {k: kw[k] for k in ("credentials", "username", "password", "ca_file") if k in kw}
        super().__init__(namesrv, **auth)
        self.names = names if names is not None else NameServers(namesrv, **auth)
        self.routes = RouteCache(self.names, route_refresh_interval_ms, send_latency_fault_enable,
                                 auto_create_topic_enable, default_topic_queues)
        self.retries = retry_times_when_send_failed
        self.retry_unknown = kw.get("retry_when_outcome_unknown", True)
        self._kw = dict(kw, retry_times_when_send_failed=retry_times_when_send_failed)
        self.ids = MessageIds()
        self.groups: dict[str, Producer] = {}
        self._members_at: dict[str, int] = {}  # group -> RouteTable.version its members were taken at
        self._tasks: set[asyncio.Task] = set()  # route fetches and cross-group retries in progress
        self._sticky: dict[str, tuple[str, int]] = {}  # topic -> (group, queue) for this loop pass
        self._unstick: asyncio.Handle | None = None
        self._last_refresh_check = 0.0

    def _group(self, name: str) -> Producer:
        p = self.groups.get(name)
        table = self.routes.table
        if p is not None and self._members_at.get(name) == table.version:
            return p  # no route changed since this group's members were last taken (every send asks)
        addrs = table.addresses_of(name)
        if p is None:
            p = self.groups[name] = Producer(addrs, **self._kw)
        else:
            known = {f"{h}:{port}" for h, port in p.addresses}
            for a in addrs:  # a new member (a replaced node): the group's producer may use it
                if a not in known:
                    p.addresses.extend(parse_bootstrap([a]))
        self._members_at[name] = table.version
        return p

    def _pick(self, topic: str, last_broker: str | None = None) -> tuple[str, int] | None:
        table = self.routes.table
        if last_broker is not None:
            return table.select(topic, last_broker, time.monotonic() * 1000)
        q = self._sticky.get(topic)
        if q is None:
            q = self._sticky[topic] = table.select(topic, None, time.monotonic() * 1000)
            if self._unstick is None:
                self._unstick = asyncio.get_running_loop().call_soon(self._next_pass)
        return q

    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _next_pass(self) -> None:
        self._sticky.clear()
        self._unstick = None
        now = time.monotonic()
        if now - self._last_refresh_check >= 1.0:
            self._last_refresh_check = now
            if self.routes.table.stale(now * 1000):
                self._spawn(self.routes.refresh_stale())

    def send_nowait(self, topic: str, body: bytes, key=None, tags: str | None = None,
                    properties: dict | None = None, flags: int = 0) -> asyncio.Future:
        """A future of the message's SendResult (with broker_name) or its SendError."""
        out = asyncio.get_running_loop().create_future()
        args = (topic, body, key, tags, properties, flags, self.ids.next())
        q = self._pick(topic) if self.routes.table.known(topic) else None
        if q is None:
            self._spawn(self._send_later(out, args))
        else:
            self._send_to(out, args, q, self.retries)
        return out

    async def send_async(self, topic: str, body: bytes, key=None, tags: str | None = None,
                         properties: dict | None = None, flags: int = 0) -> SendResult:
        """Send one message and wait for its acknowledgement; while the group's producer has
        buffer_bytes_max handed over, wait for room (at most its send timeout), as Producer does."""
        deadline = time.monotonic() + self._kw.get("send_timeout_ms", 3000) / 1000
        while True:
            try:
                return await self.send_nowait(topic, body, key, tags, properties, flags)
            except ProducerBufferFull:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.005)

    def send(self, topic: str, body: bytes, key=None, tags: str | None = None,
             properties: dict | None = None, flags: int = 0) -> SendResult:
        return self._run(self.send_async(topic, body, key, tags, properties, flags))

    async def _send_later(self, out: asyncio.Future, args, last_broker: str | None = None,
                          left: int | None = None, tried: tuple = (0, False)) -> None:
        try:
            await self.routes.ensure(args[0])
            q = self._pick(args[0], last_broker)
            if q is None:
                raise SendError(Code.NO_PERMISSION, f"topic {args[0]!r} has no writable queue in any "
                                "group (no group has a leader, or none takes writes)", stored=False, attempts=0)
        except asyncio.CancelledError:
            _fail(out, SendError(Code.NOT_CONNECTED, "the producer was closed before the send left",
                                 stored=False, attempts=0), tried)
            raise
        except Exception as e:
            if isinstance(e, BrokerError) and not isinstance(e, SendError):
                e = SendError(e.code, str(e), stored=False, attempts=0)
            _fail(out, e, tried)
            return
        self._send_to(out, args, q, self.retries if left is None else left, tried)

    def _send_to(self, out: asyncio.Future, args, q: tuple[str, int], left: int,
                 tried: tuple = (0, False)) -> None:
        """One group's attempt; `tried`: (attempts made in other groups, whether any of them
        may have stored the message)."""
        topic, body, key, tags, properties, flags, msg_id = args
        group = q[0]
        started = time.monotonic()
        try:
            inner = self._group(group).send_nowait(topic, body, key, tags, properties, q[1], flags, msg_id)
        except Exception as e:
            _fail(out, e, tried)
            return

        def done(f: asyncio.Future) -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
                return
            e = f.exception()
            ms = (time.monotonic() - started) * 1000
            self.routes.table.record(group, ms, e is not None, time.monotonic() * 1000)
            before, maybe = tried
            if e is None:
                r = f.result()
                out.set_result(r._replace(broker_name=group, attempts=before + r.attempts,
                                          possible_duplicate=r.possible_duplicate or maybe))
                return
            if isinstance(e, SendError) and left > 0 and (e.stored is False or (e.stored is None and self.retry_unknown)) \
                    and e.code not in (Code.MESSAGE_TOO_LARGE, Code.NO_PERMISSION, Code.AUTH_FAILED):
                self._spawn(self._retry_elsewhere(
                    out, args, group, left - 1, (before + e.attempts, maybe or e.stored is None)))
                return
            _fail(out, e, tried)
        inner.add_done_callback(done)

    async def _retry_elsewhere(self, out, args, failed_group: str, left: int, tried: tuple) -> None:
        try:
            await self.routes.refresh(args[0])
        except Exception:
            pass  # the known route stays
        await self._send_later(out, args, last_broker=failed_group, left=left, tried=tried)

    async def _close_session(self) -> None:
        """aclose() (and close(), on the blocking API's loop): sends still looking for a route
        or a group end (NOT_CONNECTED), then each group's Producer sends what waits on this
        loop and waits for every outcome."""
        tasks = [t for t in self._tasks if t.get_loop() is asyncio.get_running_loop()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in list(self.groups.values()):
            await p.aclose()
        await self.names.aclose()
        await super()._close_session()

    def close(self) -> None:
        super().close()
        for p in list(self.groups.values()):
            p.close()
        self.names.close()


class ClusterConsumer(ClientBase):
    """Consumes a topic from every group that holds it (see the module docstring); keyword
    arguments go to each group's Consumer."""

    def __init__(self, namesrv, group: str, topic: str, *,
                 route_refresh_interval_ms: int = ROUTE_REFRESH_INTERVAL_MS, names=None, **kw):
        auth = {k: kw[k] for k in ("credentials", "username", "password", "ca_file") if k in kw}
        super().__init__(namesrv, **auth)
        self.names = names if names is not None else NameServers(namesrv, **auth)  # (as ClusterProducer's)
        self.routes = RouteCache(self.names, route_refresh_interval_ms, False)
        self.group, self.topic = group, topic
        self._kw = kw
        self.consumers: dict[str, Consumer] = {}
        self._next_refresh = 0.0
        self._turn = 0
        self._warned = -1e9

    async def _sync_groups(self) -> None:
        now = time.monotonic()
        if self.consumers and now < self._next_refresh:
            return
        self._next_refresh = now + self.routes.table.refresh_interval_ms / 1000
        try:
            await self.routes.refresh(self.topic, force=not self.consumers)
        except Exception:
            if not self.consumers:
                raise
        route = self.routes.table.route(self.topic)
        for g in (route.groups if route is not None else []):
            if g.broker_name not in self.consumers:
                self.consumers[g.broker_name] = Consumer(self.routes.table.addresses_of(g.broker_name),
                                                         self.group, self.topic, **self._kw)

    async def poll_async(self, timeout_ms: int = 1000, max_messages: int = 100) -> list[Message]:
        """Messages of every group (in order per queue); [] when none came within timeout_ms."""
        await self._sync_groups()
        if not self.consumers:
            raise BrokerError(Code.TOPIC_NOT_EXIST, f"no broker group holds topic {self.topic!r}")
        names = sorted(self.consumers)
        self._turn += 1
        order = names[self._turn % len(names):] + names[:self._turn % len(names)]  # fairness
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            errors: dict[str, Exception] = {}
            for name in order:  # polls that never wait: nothing is ever cancelled mid-take
                try:  # (a group's first poll starts its consumer, which must finish)
                    got = await self.consumers[name].poll_async(0, max_messages)
                except TidelogError as e:  # that group only: the others go on
                    errors[name] = e
                    continue
                if got:
                    self._warn(errors)
                    return [m._replace(broker_name=name) for m in got]
            live = [n for n in order if n not in errors]
            self._warn(errors)
            if not live:  # every group failed: say why (the first group's error)
                raise errors[order[0]]
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            waits = [asyncio.ensure_future(self.consumers[n].data_event().wait()) for n in live]
            try:  # until a group may have messages (waiting on an event takes nothing)
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def _warn(self, errors: dict) -> None:
        now = time.monotonic()
        if errors and now - self._warned >= 30:
            self._warned = now
            log.warning("consuming %s: skipping group(s) that failed for now: %s", self.topic,
                        "; ".join(f"{g}: {e}" for g, e in sorted(errors.items())))

    async def commit_async(self) -> None:
        for c in self.consumers.values():
            await c.commit_async()

    async def assignment_async(self) -> list[tuple[str, int]]:
        await self._sync_groups()
        out = []
        for name, c in sorted(self.consumers.items()):
            out += [(name, q) for q in await c.assignment_async()]
        return out

    async def seek_async(self, queue: tuple[str, int], offset: int) -> None:
        """Read (group, queue_id), as assignment() names it, from `offset` on (ValueError when
        this consumer does not own it)."""
        group, queue_id = queue
        if group not in self.consumers:
            raise ValueError(f"queue {queue} is not assigned to this consumer")
        await self.consumers[group].seek_async(queue_id, offset)

    def poll(self, timeout_ms: int = 1000, max_messages: int = 100) -> list[Message]:
        return self._run(self.poll_async(timeout_ms, max_messages))

    def commit(self) -> None:
        self._run(self.commit_async())

    def assignment(self) -> list[tuple[str, int]]:
        return self._run(self.assignment_async())

    def seek(self, queue: tuple[str, int], offset: int) -> None:
        self._run(self.seek_async(queue, offset))

    async def _close_session(self) -> None:
        for c in list(self.consumers.values()):
            await c.aclose()  # commits what poll() returned on this loop
        await self.names.aclose()
        await super()._close_session()

    def close(self) -> None:
        super().close()
        for c in list(self.consumers.values()):
            c.close()
        self.names.close()


def create_topic(namesrv, topic: str, queues: int = 4, read_queues: int | None = None, perm: int = 6,
                 update: bool = False, groups: list[str] | None = None, timeout_s: float = 10.0,
                 force: bool = False, **auth) -> dict[str, object]:
    """Create (or with `update`, change) a topic on each named group (None: every group the
    name servers know), `queues` per group, as `mqadmin updateTopic -c`: CREATE_TOPIC to each
    group's leader (`force`: as Admin.create_topic's, an update that hides unconsumed messages).
    Waits (at most timeout_s) until every name server routes it to every group it was created
    on (their leaders re-register at once; one still without it is logged).
    Returns {group: TopicInfo or the exception that group raised}; a
    group the name servers do not know is a ValueError naming the ones they do."""
    from broker.client.admin import Admin

    names = NameServers(namesrv, **auth)
    try:
        info = names.cluster_info_sync()
        known = {g.broker_name: g for g in info.groups}
        chosen = sorted(known) if not groups else list(groups)
        unknown = [g for g in chosen if g not in known]
        if unknown or not chosen:
            raise ValueError(f"no broker group {', '.join(unknown) or '(none)'} among the name servers' "
                             f"{', '.join(sorted(known)) or '(none registered)'}")
        out: dict[str, object] = {}
        for g in chosen:
            addrs = [known[g].leader] if known[g].leader else []
            addrs += [n.address for n in known[g].nodes if n.address not in addrs]
            try:
                with Admin(addrs, **auth) as a:
                    out[g] = a.create_topic(topic, queues, read_queues, perm, update, force)
            except Exception as e:  # noqa: BLE001 - reported per group
                out[g] = e
        made = {g for g, r in out.items() if not isinstance(r, Exception)}
        deadline = time.monotonic() + timeout_s
        for address in (names.addresses if made else []):  # every name server routes it
            one = NameServers([f"{address[0]}:{address[1]}"], **auth)
            try:
                while True:
                    try:
                        route = one._run(one.topic_route(topic))
                    except TidelogError:
                        route = None  # down or in its grace: asked again until the deadline
                    if route is not None and made <= {gr.broker_name for gr in route.groups}:
                        break
                    if time.monotonic() >= deadline:
                        log.warning("topic %s: name server %s:%d does not route it to %s yet (brokers "
                                    "re-register every register_interval_ms)", topic, *address,
                                    ", ".join(sorted(made)))
                        break
                    time.sleep(0.1)
            finally:
                one.close()
        return out
    finally:
        names.close()

