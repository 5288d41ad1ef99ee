"""A client's name-server side (docs/design/name-server.md sections 5, 7 and 8): `NameServers`
asks any name server that answers for a topic's route, `RouteCache` keeps a RouteTable
(broker/client/routes.py) fed from them for a ClusterProducer or ClusterConsumer
(broker/client/cluster.py).

Auto-creation (RocketMQ's DefaultMQProducerImpl.tryToFindTopicPublishInfo): a topic that no
group holds is looked up once more as the auto-creation template (TEMPLATE_TOPIC, RocketMQ's
TBW102), which every leading node whose broker config has auto_create_topic_enable registers.
If a producer that allows it (`auto_create`) finds one, the topic borrows that route --
the groups that create unknown topics on their first send, with min(default_topic_queues,
the template's queues) queues each -- and sends; the group creates the topic from its own
template on the first send (broker/topics.py get_or_auto_create, which needs pub on the
topic as any send does) and re-registers at once, and the producer's next refresh (every
TEMPLATE_ROUTE_REFRESH_MS while it borrows) takes the topic's own route. Without a template
route (auto-creation off on every group, or on the name server) the send fails
TOPIC_NOT_EXIST naming the topic.
"""

from __future__ import annotations

import asyncio
import random
import time

from broker.client.base import ClientBase
from broker.client.errors import BrokerError, ConnectError, ConnectionLost, RequestTimeout
from broker.client.routes import RouteTable
from broker.namesrv import TEMPLATE_TOPIC
from broker.protocol import namesrv as ns
from broker.protocol import topics as tp
from broker.protocol.codes import Code, Req

ROUTE_REFRESH_INTERVAL_MS = 30000  # RocketMQ's pollNameServerInterval
ROUTE_REFRESH_MIN_INTERVAL_MS = 200  # a topic refreshed on errors at most this often
DEFAULT_TOPIC_QUEUES = 4  # DefaultMQProducer.defaultTopicQueueNums


class NameServerUnavailable(ConnectError):
    """No name server answered, and the topic has no known route: nothing was sent."""

    code = Code.NAMESRV_UNAVAILABLE


class NameServers(ClientBase):
    """Routes from any name server that answers (the next one on failure)."""

    source = ("the name servers", "--namesrv ...")  # where routes come from, and where topics are made

    async def topic_route(self, topic: str) -> ns.TopicRoute | None:
        """The topic's route, or None when no group holds it (TOPIC_NOT_EXIST). A name server
        that is still in its start-up grace (SYSTEM_BUSY) or does not answer in time is left
        for the next one; NameServerUnavailable when none could answer."""
        s = self._session()
        problems: list[str] = []
        for _ in range(len(self.addresses)):
            conn = None
            try:
                conn = await s.connection()
                return await s.call_json(Req.GET_TOPIC_ROUTE, tp.TopicName(topic), ns.TopicRoute)
            except BrokerError as e:
                if e.code == Code.TOPIC_NOT_EXIST:
                    return None
                if e.code != Code.SYSTEM_BUSY:
                    raise
                problems.append(str(e))
            except (RequestTimeout, ConnectionLost) as e:
                problems.append(f"{type(e).__name__}: {e}")
            except ConnectError as e:
                if e.__class__ is not ConnectError:
                    raise  # AuthenticationError: another password will not appear by retrying
                raise NameServerUnavailable(f"no name server answered ({'; '.join(problems + [str(e)])})",
                                            refused=e.refused) from None
            s.drop(conn)  # the next name server next
        raise NameServerUnavailable(f"no name server answered ({'; '.join(problems)})")

    async def cluster_info(self) -> ns.ClusterInfo:
        return await self._session().call_json(Req.GET_CLUSTER_INFO, None, ns.ClusterInfo)

    def cluster_info_sync(self) -> ns.ClusterInfo:
        return self._run(self.cluster_info())


class RouteCache:
    """A RouteTable fed from name servers, with fetches rate-limited per topic; with
    `auto_create`, a topic no group holds borrows the template's route (module docstring)."""

    def __init__(self, names: NameServers, refresh_ms: int, latency_fault: bool,
                 auto_create: bool = False, default_topic_queues: int = DEFAULT_TOPIC_QUEUES):
        if not (type(default_topic_queues) is int and 1 <= default_topic_queues <= 65535):
            raise ValueError(f"default_topic_queues: {default_topic_queues!r}, must be an int in 1..65535")
        self.names = names
        self.table = RouteTable(refresh_ms, latency_fault, start=random.randrange(1 << 16))
        self.auto_create = auto_create
        self.default_topic_queues = default_topic_queues
        self._fetching: dict[str, asyncio.Future] = {}
        self._asked: dict[str, float] = {}

    async def ensure(self, topic: str) -> None:
        """A route for `topic` (fetched if none is known; with auto_create, borrowed from the
        template if no group holds it); raises what the fetch raised, or
        BrokerError(TOPIC_NOT_EXIST) naming the topic when there is neither."""
        if self.table.known(topic):
            return
        await self.refresh(topic, force=True)
        if self.table.known(topic):
            return
        why = "this producer does not auto-create topics (auto_create_topic_enable=False)"
        if self.auto_create and topic != TEMPLATE_TOPIC:
            template = await self._fetch(TEMPLATE_TOPIC)
            if self.table.known(topic):  # another send's fetch found it meanwhile
                return
            if template is not None and self.table.apply_template(
                    topic, template, self.default_topic_queues, time.monotonic() * 1000):
                return
            why = ("and no group can auto-create it: none registers the auto-creation template "
                   f"{TEMPLATE_TOPIC} (broker auto_create_topic_enable off on every group, or on the "
                   "name servers)" if template is None else
                   f"and no group of the auto-creation template {TEMPLATE_TOPIC} takes writes now "
                   "(none has a leader)")
        source, where = self.names.source
        raise BrokerError(Code.TOPIC_NOT_EXIST, f"no broker group holds topic {topic!r} ({source} "
                          f"know no route for it), {why}; create it with `tidelog topic create "
                          f"{topic} {where}`")

    def _fetch(self, topic: str) -> asyncio.Future:
        """The route fetch for `topic` in progress, or a new one (one at a time per topic)."""
        f = self._fetching.get(topic)
        if f is None:
            f = self._fetching[topic] = asyncio.ensure_future(self.names.topic_route(topic))
            f.add_done_callback(lambda _: self._fetching.pop(topic, None))
        return asyncio.shield(f)

    async def refresh(self, topic: str, force: bool = False) -> None:
        """Fetch `topic`'s route; a failure keeps the known route (and is raised only when
        there is none). At most one fetch per topic at a time, and one per
        ROUTE_REFRESH_MIN_INTERVAL_MS unless forced. A route borrowed from the template stays
        until the topic's own route comes (only a route replaces a route)."""
        now = time.monotonic() * 1000
        if not force and now - self._asked.get(topic, -1e18) < ROUTE_REFRESH_MIN_INTERVAL_MS:
            return
        if topic not in self._fetching:
            self._asked[topic] = now
        try:
            route = await self._fetch(topic)
        except Exception:
            self.table.fetched(topic, time.monotonic() * 1000)
            if self.table.known(topic):
                return  # keep the known route: sends go on while the name servers are away
            raise
        if route is not None:
            self.table.apply(topic, route, time.monotonic() * 1000)
        else:
            self.table.fetched(topic, time.monotonic() * 1000)

    async def refresh_stale(self) -> None:
        for topic in self.table.stale(time.monotonic() * 1000):
            try:
                await self.refresh(topic)
            except Exception:  # kept; the next period tries again
                pass


_Routes = RouteCache  # its name before broker/client/namesrv_client.py
