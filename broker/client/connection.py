"""A client connection: many requests in flight, matched to answers by correlation id.

Requests made in one event-loop iteration are written together (one syscall), which is what
lets a producer keep hundreds of acknowledged sends in flight cheaply. Timeouts are checked
by one sweep every 50 ms instead of a timer per request.
"""

from __future__ import annotations

import asyncio
import ssl
import time

from broker.client.errors import AuthenticationError, ConnectError, ConnectionLost, NotSent, RequestTimeout
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol.auth import Auth, AuthStep
from broker.protocol.codes import Code, Req

SWEEP_S = 0.05
EAGER_FLUSH_REQUESTS = 16  # measured: 16 kept both processes busier than 32, 64 or once per loop pass


def parse_bootstrap(bootstrap) -> list[tuple[str, int]]:
    """"h:p,h:p" or ["h:p", "h:p,h:p"] -> [(host, port), ...]."""
    if isinstance(bootstrap, str):
        bootstrap = [bootstrap]
    out = []
    for b in (part for item in bootstrap for part in str(item).split(",") if part.strip()):
        host, sep, port = str(b).strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad bootstrap address {b.strip()!r}: expected host:port, e.g. 127.0.0.1:10911")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no bootstrap address given")
    return out


PLAIN_TO_TLS_HINT = ("closed by the broker before it answered anything (a broker with security on "
                     "speaks TLS only: give the client the cluster CA -- ca_file=, TIDELOG_CA_FILE or "
                     "a TIDELOG_CREDENTIALS file, which eval \"$(tidelog cluster env --data-dir D)\" sets)")


def tls_failure(host: str, port: int, e: ssl.SSLError, credentials) -> str:
    """What a failed TLS handshake means, in words: a certificate from another CA, one that does
    not name the address dialed, or the broker refusing ours."""
    where = f"TLS handshake with {host}:{port} failed"
    if isinstance(e, ssl.SSLCertVerificationError):
        detail = e.verify_message or e.reason or str(e)
        if e.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH (IP addresses too)
            return (f"{where}: {detail} (the node's certificate does not name {host}: dial an "
                    f"address it was issued for, as in the group's peers)")
        return f"{where}: {detail} (is {credentials.ca_file} the CA of this cluster?)"
    return f"{where}: {e.reason or e} (is {credentials.ca_file} the CA of this cluster?)"


def _settle(item, frame, error) -> None:
    """A pending request's outcome: its future's result (the answer) or exception, then its
    on_done hook."""
    fut, _, on_done = item
    if fut.done():
        return
    if error is None:
        fut.set_result(frame)
    else:
        fut.set_exception(error)
    if on_done is not None:
        try:
            on_done(fut)
        except Exception as e:  # a bug in the hook must not stop this connection's reading
            fut.get_loop().call_exception_handler({"message": "request on_done hook failed",
                                                   "exception": e, "future": fut})


class ClientConnection(asyncio.Protocol):
    def __init__(self, frame_bytes_max: int):
        self.decoder = fr.FrameDecoder(frame_bytes_max)
        self.transport = None
        self.address = ""
        self.loop = asyncio.get_running_loop()
        self.pending: dict[int, tuple] = {}  # corr -> (future, deadline, on_done or None)
        self._unsent: list[int] = []  # correlation ids queued in `_out`
        self._out: list[bytes] = []
        self._out_bytes = 0  # bytes in `_out`
        self.queued_total = 0  # bytes ever handed to this connection (a stream position)
        self._flush_scheduled = False
        self._sweeping = False
        self._next = 0
        self.closed = False
        self.retired = False
        self.lost: Exception | None = None
        self.tls = False
        self.received = False  # any byte ever came back (a closed plain connection says more then)

    @classmethod
    async def open(cls, host: str, port: int, timeout_s: float,
                   frame_bytes_max: int = fr.FRAME_BYTES_MAX_DEFAULT, credentials=None,
                   member: str | None = None) -> ClientConnection:
        """Connect; with `credentials` (broker/client/security.py) over TLS trusting the
        cluster CA, then authenticate as its user (SCRAM-SHA-256) before returning.
        `member`: a group member dialing member `member` -- over TLS the server's certificate
        must name it (tidelog-member:<id>), or AuthenticationError: any certificate the CA
        issued for the address would pass the hostname check, not only that member's."""
        loop = asyncio.get_running_loop()
        ctx = credentials.ssl_context() if credentials is not None else None
        try:
            async with asyncio.timeout(timeout_s):  # (not wait_for: broker/tasks.py)
                _, conn = await loop.create_connection(lambda: cls(frame_bytes_max), host, port, ssl=ctx)
        except ssl.SSLError as e:
            raise AuthenticationError(tls_failure(host, port, e, credentials)) from None
        except (OSError, asyncio.TimeoutError) as e:
            raise ConnectError(f"cannot connect to {host}:{port}: {e or 'timed out'}",
                               refused=isinstance(e, ConnectionRefusedError)) from None
        conn.address = f"{host}:{port}"
        conn.tls = ctx is not None
        if member is not None and ctx is not None:
            from broker.security.tls import MemberMismatch, require_member
            try:
                require_member(conn.transport, member)
            except MemberMismatch as e:
                conn.abort()
                raise AuthenticationError(f"{host}:{port} is not member {member}: {e.args[0] if e.args else e}") from None
        if credentials is not None and credentials.username:
            try:
                async with asyncio.timeout(timeout_s):
                    await conn._authenticate(credentials)
            except BaseException as e:
                conn.abort()
                if isinstance(e, (ConnectionLost, NotSent)) and credentials.cert_file:
                    raise AuthenticationError(f"{host}:{port} closed the connection right after the TLS "
                                              f"handshake: it does not trust this certificate "
                                              f"({credentials.cert_file}; from another cluster's CA?)") from None
                if isinstance(e, (asyncio.TimeoutError, ConnectionLost, NotSent, RequestTimeout)):
                    raise ConnectError(f"{host}:{port} did not complete authentication: {e or 'timed out'}") from None
                raise
        return conn

    async def _authenticate(self, creds) -> None:
        from broker.security.scram import AuthFailed, ClientExchange
        ex = ClientExchange(creds.username, creds.password)
        message = ex.first()
        for _ in range(2):
            f = await self.request(Req.AUTH, jsonbody.encode(Auth(message)), 30.0)
            if f.code != Code.SUCCESS:
                why = f.headers.get("error", "")
                raise AuthenticationError(f"AUTH_FAILED: {self.address} refused user {creds.username!r} "
                                          f"(credentials from {creds.source}): {why}", login=True)
            step = jsonbody.decode(AuthStep, f.body)
            try:
                if step.done:
                    if step.message:  # an insecure broker answers done at once, with nothing to check
                        ex.finish(step.message)
                    return
                message = ex.step(step.message)
            except AuthFailed as e:
                raise AuthenticationError(f"AUTH_FAILED: {self.address}: {e}") from None
        raise AuthenticationError(f"AUTH_FAILED: {self.address}: the exchange did not finish")

    # --- requests --------------------------------------------------------------------------

    def request(self, code: int, body=b"", timeout_s: float = 3.0, headers: dict | None = None,
                on_done=None, flush: bool = True) -> asyncio.Future:
        """Send a request (body: bytes, or a tuple of parts written back to back); the
        future resolves to the answering Frame. `on_done(future)`, if given, is called as
        soon as the future is settled, in the same loop pass (a done-callback would run a
        pass later: at W=1 each pass costs a poll and ~10 us of loop). `flush=False`: the
        caller calls flush() once it has queued everything of this pass."""
        fut = self.loop.create_future()
        if self.closed:
            fut.set_exception(NotSent(f"connection to {self.address} is closed"))
            if on_done is not None:
                on_done(fut)
            return fut
        corr = self._next = (self._next + 1) & 0xFFFFFFFF
        self.pending[corr] = (fut, time.monotonic() + timeout_s, on_done)
        if type(body) is tuple:
            self._queue(fr.encode_header(code, corr, sum(map(len, body))), body)
        else:
            self._queue(fr.encode(code, corr, body, headers))
        self._unsent.append(corr)
        if len(self._unsent) >= EAGER_FLUSH_REQUESTS:
            self._flush()  # let the broker start on these while we build the rest
        elif flush:
            self._schedule_flush()
        if not self._sweeping:
            self._sweeping = True
            self.loop.call_later(SWEEP_S, self._sweep)
        return fut

    def oneway(self, code: int, body=b"") -> None:
        """Send without wanting an answer (body: bytes, or a tuple of parts)."""
        if self.closed:
            raise NotSent(f"connection to {self.address} is closed")
        if type(body) is tuple:
            self._queue(fr.encode_header(code, 0, sum(map(len, body)), fr.FLAG_ONEWAY), body)
        else:
            self._queue(fr.encode(code, 0, body, None, fr.FLAG_ONEWAY))
        self._schedule_flush()

    def _queue(self, head: bytes, parts=()) -> None:
        n = len(head) + sum(map(len, parts))
        self._out.append(head)
        self._out.extend(parts)
        self._out_bytes += n
        self.queued_total += n

    def queued_bytes(self) -> int:
        """Bytes given to this connection that the kernel has not taken yet (waiting for
        the next flush, or in the transport's write buffer because the peer does not read)."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return self._out_bytes + buffered

    def _flush(self) -> None:
        if self._out and not self.closed:
            self.transport.writelines(self._out)  # a gathering write: nothing joined here
        self._out.clear()
        self._out_bytes = 0
        self._unsent.clear()

    def flush(self) -> None:
        """Write what is queued now instead of on the next loop pass (a caller that has
        queued everything this pass makes)."""
        if self._out:
            self._flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _sweep(self) -> None:
        if not self.pending or self.closed:
            self._sweeping = False
            return
        now = time.monotonic()
        expired = [c for c, (_, deadline, _) in self.pending.items() if deadline <= now]
        for c in expired:
            _settle(self.pending.pop(c), None, RequestTimeout(f"no answer from {self.address} in time"))
        self.loop.call_later(SWEEP_S, self._sweep)

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        pending = self.pending
        for f in self.decoder.feed(data):
            item = pending.pop(f.corr_id, None)
            if item is not None:
                _settle(item, f, None)
        if self.decoder.error is not None:
            self.transport.close()
        elif self.retired and not pending:
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        why = self.decoder.error or exc or "closed by the broker"
        plain_to_tls = not self.received and not self.tls and exc is None and self.decoder.error is None
        if plain_to_tls:
            why = PLAIN_TO_TLS_HINT
        self.lost = ConnectionLost(f"connection to {self.address} lost: {why}", plain_to_tls)
        unsent = set(self._unsent)
        pending, self.pending = self.pending, {}
        for corr, item in pending.items():
            if corr in unsent:
                _settle(item, None, NotSent(f"connection to {self.address} lost before sending"))
            else:
                _settle(item, None, ConnectionLost(f"connection to {self.address} lost: {why}", plain_to_tls))

    def close(self) -> None:
        if not self.closed:
            self._flush()
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        """Close now, discarding what the peer has not read (close() would wait for it)."""
        if not self.closed:
            self.closed = True
            self._out.clear()
            self._out_bytes = 0
            self.transport.abort()

    def retire(self) -> None:
        """Close once the requests in flight have their answers (no new ones are sent)."""
        self.retired = True
        if not self.pending:
            self.close()
