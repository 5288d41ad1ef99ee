"""What the Producer, Consumer and Admin clients share: connections bound to event loops,
and a blocking facade.

Each client keeps one connection per event loop it is used from: `await x.send_async(...)`
uses the caller's loop; the blocking methods (`x.send(...)`) run on a private background
loop thread, so they work from plain threaded code. Calling a blocking method from inside a
running event loop is refused (it would stall that loop).
"""

from __future__ import annotations

import asyncio
import threading

import uvloop

from broker.client.connection import ClientConnection, parse_bootstrap
from broker.client.errors import (AuthenticationError, BrokerError, ConnectError, ConnectionLost,
                                  PermissionDenied, RequestTimeout)
from broker.client.security import Credentials
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol.codes import Code

LEADER_HOPS_MAX = 6  # NOT_LEADER answers followed before giving up
LEADER_RETRY_S = 0.1  # back-off per hop (an election takes a few hundred ms)


class _BackgroundLoop:
    def __init__(self, name: str):
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Session:
    """A client's connection on one event loop."""

    def __init__(self, client: ClientBase):
        self.client = client
        self.conn: ClientConnection | None = None
        self._lock = asyncio.Lock()
        self._preferred = 0

    async def connection(self) -> ClientConnection:
        conn = self.conn
        if conn is not None and not conn.closed:
            return conn
        async with self._lock:
            if self.conn is not None and not self.conn.closed:
                return self.conn
            addrs = self.client.addresses
            errors: list[ConnectError] = []
            for i in range(len(addrs)):
                k = (self._preferred + i) % len(addrs)
                host, port = addrs[k]
                try:
                    self.conn = await self.client.open_connection(host, port)
                    self._preferred = k
                    return self.conn
                except AuthenticationError as e:
                    if e.login:
                        raise  # every member checks the same users: the next one would refuse too
                    errors.append(e)  # one node's certificate (mid-rotation, another address): go on
                except ConnectError as e:
                    errors.append(e)
            if all(isinstance(e, AuthenticationError) for e in errors):
                raise AuthenticationError("; ".join(map(str, errors)))
            raise ConnectError("; ".join(map(str, errors)), refused=all(e.refused for e in errors))

    def drop(self, conn: ClientConnection | None) -> None:
        """Forget a broken connection and try the next address next time."""
        if conn is not None and self.conn is conn:
            conn.close()
            self.conn = None
            self._preferred += 1

    def follow(self, f: fr.Frame, conn: ClientConnection | None) -> None:
        """A NOT_LEADER answer on `conn`: go to the leader it names, or else to the next
        address. The old connection is retired, not cut: requests still in flight on it
        get their own (NOT_LEADER) answers, which must not turn into "outcome unknown"."""
        if conn is not None and conn is not self.conn:
            return  # another request already moved this session on
        leader = f.headers.get("leader")
        addrs = self.client.addresses
        if leader:
            host, port = parse_bootstrap([leader])[0]
            if (host, port) not in addrs:
                addrs.append((host, port))  # a member the bootstrap list did not name
            target = addrs.index((host, port))
        else:
            target = self._preferred + 1
        if self.conn is not None:
            self.conn.retire()
            self.conn = None
        self._preferred = target

    async def call(self, code: int, body: bytes = b"", timeout_s: float | None = None,
                   conn: ClientConnection | None = None) -> fr.Frame:
        conn = conn or await self.connection()
        try:
            return await conn.request(code, body, timeout_s or self.client.request_timeout_s)
        except (RequestTimeout, ConnectionLost):
            self.drop(conn)  # silent or gone (e.g. a hung leader): reconnect next time
            raise

    async def call_json(self, code: int, request, response_cls=None, ok=(Code.SUCCESS,)):
        body = jsonbody.encode(request) if request is not None else b"{}"
        for attempt in range(LEADER_HOPS_MAX):
            conn = await self.connection()
            f = await self.call(code, body, conn=conn)
            if f.code not in (Code.NOT_LEADER, Code.LEADER_TRANSFERRING):
                break
            self.follow(f, conn)  # a raft group member that does not lead: ask the leader
            await asyncio.sleep(LEADER_RETRY_S * attempt)
        if f.code not in ok:
            if f.code == Code.NO_PERMISSION:
                raise PermissionDenied(f.code, f.headers.get("error", ""))
            if f.code == Code.AUTH_FAILED:
                raise AuthenticationError(f"AUTH_FAILED: {f.headers.get('error', '')}")
            raise BrokerError(f.code, f.headers.get("error", ""))
        if response_cls is None:
            return f
        return jsonbody.decode(response_cls, f.body)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class ClientBase:
    def __init__(self, bootstrap, *, request_timeout_ms: int = 3000, connect_timeout_ms: int = 3000,
                 frame_bytes_max: int = fr.FRAME_BYTES_MAX_DEFAULT, credentials=None,
                 username: str | None = None, password: str | None = None, ca_file: str | None = None):
        """credentials / username, password, ca_file: see broker/client/security.py (arguments,
        then TIDELOG_USERNAME/TIDELOG_PASSWORD/TIDELOG_CA_FILE, then TIDELOG_CREDENTIALS)."""
        self.credentials = Credentials.resolve(credentials, username, password, ca_file)
        self.addresses = parse_bootstrap(bootstrap)
        self.request_timeout_s = request_timeout_ms / 1000
        self.connect_timeout_s = connect_timeout_ms / 1000
        self.frame_bytes_max = frame_bytes_max
        self._sessions: dict[asyncio.AbstractEventLoop, Session] = {}
        self._bg: _BackgroundLoop | None = None
        self._bg_lock = threading.Lock()
        self._closed = False

    async def open_connection(self, host: str, port: int) -> ClientConnection:
        """A new authenticated connection to one node."""
        return await ClientConnection.open(host, port, self.connect_timeout_s, self.frame_bytes_max,
                                           self.credentials)

    def _new_session(self) -> Session:
        return Session(self)

    def _session(self) -> Session:
        loop = asyncio.get_running_loop()
        s = self._sessions.get(loop)
        if s is None:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            s = self._sessions[loop] = self._new_session()
        return s

    def _run(self, coro):
        """Run a coroutine on the private loop and wait for it (the blocking API)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            name = coro.__name__
            coro.close()
            raise RuntimeError(f"{type(self).__name__}.{name.removesuffix('_async')}() blocks and "
                               f"would stall this event loop: use await {type(self).__name__}."
                               f"{name}() here")
        with self._bg_lock:
            if self._closed:
                coro.close()
                raise RuntimeError(f"{type(self).__name__} is closed")
            if self._bg is None:
                self._bg = _BackgroundLoop(f"tidelog-{type(self).__name__.lower()}")
        return self._bg.run(coro)

    async def _close_session(self) -> None:
        s = self._sessions.pop(asyncio.get_running_loop(), None)
        if s is not None:
            await self._before_close(s)
            s.close()

    async def _before_close(self, session: Session) -> None:
        """Subclasses flush work (e.g. commit offsets) before a session closes."""

    async def aclose(self) -> None:
        await self._close_session()

    def close(self) -> None:
        with self._bg_lock:
            self._closed = True  # first: no new session (nor background loop) from now on
            bg, self._bg = self._bg, None
        if bg is not None:
            bg.run(self._close_session())
            bg.stop()
        for loop, s in list(self._sessions.items()):
            if not loop.is_closed():
                loop.call_soon_threadsafe(s.close)
        self._sessions.clear()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
