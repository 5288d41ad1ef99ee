"""A client's view of topics spread over broker groups, learned from name servers
(docs/design/name-server.md sections 5-7). Pure: no sockets, no clock (time comes in as
`now_ms`), no tasks. The producer and the consumer drive it.

A topic is the union of its groups' queues; a queue is (broker_name, queue_id). After
RocketMQ's client (MQClientInstance, TopicPublishInfo, MQFaultStrategy, LatencyFaultToleranceImpl):

- `apply` replaces a topic's route only with a route: a failed fetch or a TOPIC_NOT_EXIST
  answer never removes a known one (the old topicRouteTable entry stays when the fetch
  returns null), so sends to known topics go on while every name server is down.
- `publish_queues`: queue ids below write_queues of every writable group that has a leader
  (topicRouteData2TopicPublishInfo: writable and master alive), interleaved across groups
  (g0 q0, g1 q0, g0 q1, ...) so that consecutive picks change group.
  `subscribe_queues`: below read_queues of every readable group, with or without a leader
  (followers serve reads).
- `select(topic, last_broker)`: round robin, one counter per topic (sendWhichQueue); a retry
  names the group of the attempt that failed and gets a queue of another group when there
  is one (selectOneMessageQueue(lastBrokerName)). With latency fault tolerance on, first a
  group that is available, then one that is reachable, then any (MQFaultStrategy's three
  steps, 5.x).
- `record(broker, latency_ms, failed)`: after each attempt, the group is avoided for the
  not_available_duration of the largest latency_max step its latency reached; a failed
  attempt counts as 10,000 ms and marks the group unreachable (updateFaultItem with
  isolation; computeNotAvailableDuration).
- `apply_template(topic, template, default_topic_queues)`: a topic no group holds borrows the
  auto-creation template's route (the groups that create it on first send), each group's
  queues capped at min(default_topic_queues, the template's read queues), with exists=False
  (updateTopicRouteInfoFromNameServer(topic, isDefault=true, producer)). Such a route is
  refreshed every TEMPLATE_ROUTE_REFRESH_MS until the topic's own route replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

PERM_READ = 4  # broker/protocol/topics.py's bits
PERM_WRITE = 2

LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)  # MQFaultStrategy (HEAD)
NOT_AVAILABLE_DURATION_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
ISOLATION_LATENCY_MS = 10000  # what a failed attempt counts as
# a route borrowed from the template is a guess: the group that creates the topic re-registers
# at once, so its own route (real queue count) is there to be fetched within moments
TEMPLATE_ROUTE_REFRESH_MS = 1000


def not_available_ms(latency_ms: float, latency_max=LATENCY_MAX_MS, durations=NOT_AVAILABLE_DURATION_MS) -> int:
    """computeNotAvailableDuration: the duration of the largest step `latency_ms` reached."""
    for step, duration in zip(reversed(latency_max), reversed(durations)):
        if latency_ms >= step:
            return duration
    return 0


@dataclass
class _Fault:
    latency_ms: float
    available_at_ms: float
    reachable: bool


@dataclass
class _Topic:
    route: object  # protocol TopicRoute: topic, version, exists, groups[GroupRoute]
    fetched_ms: float
    publish: list[tuple[str, int]] = field(default_factory=list)
    subscribe: list[tuple[str, int]] = field(default_factory=list)
    counter: int = 0


class RouteTable:
    def __init__(self, refresh_interval_ms: int = 30000, latency_fault: bool = False,
                 latency_max_ms=LATENCY_MAX_MS, not_available_duration_ms=NOT_AVAILABLE_DURATION_MS,
                 start: int = 0):
        if len(latency_max_ms) != len(not_available_duration_ms):
            raise ValueError("latency_max_ms and not_available_duration_ms need the same number of steps")
        self.refresh_interval_ms = refresh_interval_ms
        self.latency_fault = latency_fault
        self.latency_max_ms = tuple(latency_max_ms)
        self.not_available_duration_ms = tuple(not_available_duration_ms)
        self._start = start  # each topic's first counter value (a random start spreads producers)
        self._topics: dict[str, _Topic] = {}
        self._faults: dict[str, _Fault] = {}
        self.version = 0  # bumped whenever a route changes: callers cache what they derive from routes

    # --- routes -----------------------------------------------------------------------------

    def apply(self, topic: str, route, now_ms: float) -> bool:
        """Take a fetched route; True if it differs from the one held (by version or content)."""
        t = self._topics.get(topic)
        changed = t is None or t.route != route
        if t is None:
            t = self._topics[topic] = _Topic(route, now_ms, counter=self._start)
        t.route, t.fetched_ms = route, now_ms
        if changed:
            self.version += 1
            groups = sorted(route.groups, key=lambda g: g.broker_name)
            # interleaved (g0 q0, g1 q0, g0 q1, ...), not group by group as RocketMQ lists them:
            # a producer picks one queue per loop pass, and consecutive picks should change group
            writable = [g for g in groups if g.perm & PERM_WRITE and g.leader]
            t.publish = [(g.broker_name, q) for q in range(max((g.write_queues for g in writable), default=0))
                         for g in writable if q < g.write_queues]
            t.subscribe = [(g.broker_name, q) for g in groups if g.perm & PERM_READ
                           for q in range(g.read_queues)]
        return changed

    def apply_template(self, topic: str, template, default_topic_queues: int, now_ms: float) -> bool:
        """Take the auto-creation template's route for `topic`, which has no route of its own
        (see the module docstring); False (nothing taken) if `topic` already has a route (its own
        or borrowed: only a fetched route replaces one) or none of the template's groups takes
        writes now (writable, with a leader)."""
        if topic in self._topics:
            return False
        groups = []
        for g in template.groups:
            n = min(default_topic_queues, g.read_queues)
            groups.append(replace(g, write_queues=n, read_queues=n))
        if not any(g.perm & PERM_WRITE and g.leader and g.write_queues > 0 for g in groups):
            return False
        return self.apply(topic, replace(template, topic=topic, exists=False, groups=type(template.groups)(groups)),
                          now_ms)

    def borrowed(self, topic: str) -> bool:
        """True while `topic`'s route is the template's (apply_template), not its own."""
        t = self._topics.get(topic)
        return t is not None and not t.route.exists

    def fetched(self, topic: str, now_ms: float) -> None:
        """A fetch of a known topic failed or said nothing new: keep the route, and do not ask
        again before the next period."""
        t = self._topics.get(topic)
        if t is not None:
            t.fetched_ms = now_ms

    def known(self, topic: str) -> bool:
        return topic in self._topics

    def route(self, topic: str):
        t = self._topics.get(topic)
        return t.route if t is not None else None

    def topics(self) -> list[str]:
        return list(self._topics)

    def stale(self, now_ms: float) -> list[str]:
        """Topics whose last fetch is at least refresh_interval_ms old (TEMPLATE_ROUTE_REFRESH_MS
        for a route borrowed from the template)."""
        borrowed_ms = min(self.refresh_interval_ms, TEMPLATE_ROUTE_REFRESH_MS)
        return [name for name, t in self._topics.items()
                if now_ms - t.fetched_ms >= (self.refresh_interval_ms if t.route.exists else borrowed_ms)]

    def publish_queues(self, topic: str) -> list[tuple[str, int]]:
        t = self._topics.get(topic)
        return list(t.publish) if t is not None else []

    def subscribe_queues(self, topic: str) -> list[tuple[str, int]]:
        t = self._topics.get(topic)
        return list(t.subscribe) if t is not None else []

    def _group(self, broker_name: str):
        """The group as the most recently fetched route that lists it says."""
        best, at = None, None
        for t in self._topics.values():
            for g in t.route.groups:
                if g.broker_name == broker_name and (at is None or t.fetched_ms > at):
                    best, at = g, t.fetched_ms
        return best

    def leader_of(self, broker_name: str) -> str | None:
        g = self._group(broker_name)
        return g.leader if g is not None else None

    def addresses_of(self, broker_name: str) -> list[str]:
        """The group's leader first, then its followers (the order to try them in)."""
        g = self._group(broker_name)
        if g is None:
            return []
        return ([g.leader] if g.leader else []) + [a for a in g.followers if a != g.leader]

    # --- choosing a queue ---------------------------------------------------------------------

    def select(self, topic: str, last_broker: str | None = None, now_ms: float = 0.0) -> tuple[str, int] | None:
        """The queue for the next attempt, or None when the topic has no writable queue."""
        t = self._topics.get(topic)
        if t is None or not t.publish:
            return None
        other = (lambda q: q[0] != last_broker) if last_broker is not None else (lambda q: True)
        if self.latency_fault:
            for usable in (self.available, self.reachable):
                q = self._next(t, lambda q: other(q) and usable(q[0], now_ms))
                if q is not None:
                    return q
        else:
            q = self._next(t, other)
            if q is not None:
                return q
        return self._next(t, lambda q: True)

    @staticmethod
    def _next(t: _Topic, ok):
        """The next queue in round-robin order that `ok` accepts, trying each once."""
        queues, n = t.publish, len(t.publish)
        for _ in range(n):
            t.counter += 1
            q = queues[t.counter % n]
            if ok(q):
                return q
        return None

    # --- latency fault tolerance ---------------------------------------------------------------

    def record(self, broker_name: str, latency_ms: float, failed: bool, now_ms: float) -> None:
        """After an attempt on `broker_name` (updateFaultItem): only with latency fault tolerance on."""
        if not self.latency_fault:
            return
        latency = ISOLATION_LATENCY_MS if failed else latency_ms
        duration = not_available_ms(latency, self.latency_max_ms, self.not_available_duration_ms)
        f = self._faults.get(broker_name)
        if f is None:
            f = self._faults[broker_name] = _Fault(latency_ms, now_ms, True)
        f.latency_ms, f.reachable = latency_ms, not failed
        if duration > 0 and now_ms + duration > f.available_at_ms:  # updateNotAvailableDuration:
            f.available_at_ms = now_ms + duration  # a fast attempt never shortens an avoidance

    def available(self, broker_name: str, now_ms: float) -> bool:
        f = self._faults.get(broker_name)
        return f is None or now_ms >= f.available_at_ms

    def reachable(self, broker_name: str, now_ms: float = 0.0) -> bool:
        f = self._faults.get(broker_name)
        return f is None or f.reachable
