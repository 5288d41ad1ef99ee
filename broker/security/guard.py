"""The broker's door: who is on a connection, and whether a request may run.

A connection is authenticated one of two ways (broker/connection.py holds the result):
- a group member presents, in the TLS handshake, a certificate from the cluster CA naming it
  (broker/security/tls.py peer_member) and it is one of this group's `peers`: it may send
  replication traffic (RAFT frames; the HA port takes nothing else) and run admin operations
  (a CA certificate naming anyone else gives no rights: that connection authenticates as a user);
- a user runs a SCRAM-SHA-256 exchange (AUTH requests, broker/security/scram.py) and gets
  what the roles of its entry grant (broker/security/acl.py): the config's users and roles,
  overlaid with the runtime changes of ACL_UPDATE (broker/acl_store.py, `update`).
Until then every request but AUTH is answered AUTH_FAILED ("authenticate first"); a RAFT frame
from anyone but a member is dropped and logged (it is oneway: there is no one to answer).

Which request needs what is the table below; topic- and group-level checks happen where the
body is decoded (send, pull, offsets, queries, group heartbeats), through `require`.
`insecure: true` (no TLS, no users) makes every connection an anonymous admin.

Runtime changes (`update`) take effect at once, on existing connections too: each user
connection is re-resolved by its name when the users or roles change (not on every request:
the data path pays nothing). A user whose roles changed gets the new rights on its next
request; a deleted user, or one whose verifier (password) changed, loses its principal and
its next request is answered AUTH_FAILED ("authenticate first") -- it must log in again.
"""

from __future__ import annotations

import logging
import time
import weakref
from pathlib import Path

from broker import acl_store
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol.auth import Auth, AuthStep
from broker.protocol.codes import BadRequest, Code, Req
from broker.ratelog import RateLimitedLog
from broker.security import acl
from broker.security.scram import MECHANISM, SHA512, AuthFailed, ServerExchange, fake_salt_secret, parse_verifier

log = logging.getLogger(__name__)

AUTH_FAILURES_MAX = 3  # failed exchanges on one connection before it is closed
REFUSAL_LOG_S = 1.0  # refusals of one kind are logged at most this often (a flood is one line)

# request -> what it needs, checked before the body is read; requests not named here are
# open to any authenticated principal (STATUS, topic listings, routes) or checked on their
# bodies (SEND, PULL, offsets, queries, HEARTBEAT, DESCRIBE_GROUP)
ADMIN_ONLY = {
    Req.CREATE_TOPIC: "create or change topics", Req.TRANSFER_LEADER: "transfer leadership",
    Req.HA_ROLE: "promote, fence or re-point a node", Req.FAULT: "inject faults",
    Req.LIST_GROUPS: "list every consumer group", Req.GET_METADATA: "read the group's metadata",
    Req.ACL_UPDATE: "list or change users and roles",
}
MEMBER_ONLY = {Req.RAFT}
GATED = frozenset({Req.AUTH, *ADMIN_ONLY, *MEMBER_ONLY})  # requests gate() looks at once authenticated


class Denied(Exception):
    def __init__(self, code: Code, message: str):
        self.code = code
        super().__init__(message)


class AuthState:
    """A connection's authentication bookkeeping (Connection.auth)."""
    __slots__ = ("exchange", "failures", "pub_ok", "user", "verifier")

    def __init__(self):
        self.exchange: ServerExchange | None = None  # a SCRAM exchange in progress
        self.failures = 0
        self.pub_ok: set[str] = set()  # topics this principal was found to be allowed to publish to
        self.user: str | None = None  # who authenticated (SCRAM) on this connection
        self.verifier = None  # ... with which verifier (a changed password logs sessions out)


class Guard:
    def __init__(self, config, store: acl_store.AclStore | None = None):
        """`store`: the runtime users and roles; by default the one of `config.data_dir`
        (acl_store.shared), whose acl.json overlays the config's users and roles."""
        self.secure = config.secure
        self.acl = acl.Acl(config.roles, config.users)
        self.verifiers = {u.name: parse_verifier(u.scram) for u in config.users}
        self.verifiers512 = {u.name: parse_verifier(u.scram512, SHA512) for u in config.users if u.scram512}
        self._sessions: weakref.WeakSet = weakref.WeakSet()  # connections authenticated as users
        # who may be a member here: this group's peers. A certificate the cluster CA issued for
        # anyone else (another group's node, a node taken out of the group, a client) proves
        # nothing on this node: it must authenticate as a user like any client
        self.members = frozenset(p.id for p in config.peers)
        self._secret = fake_salt_secret(self.verifiers)
        self._log = RateLimitedLog(log, REFUSAL_LOG_S)  # refusals: a line a second per kind
        self.acl_store = store if store is not None else acl_store.shared(
            Path(config.data_dir) / "config" / acl_store.ACL_FILE)
        self.acl_store.bind(config.users, config.roles, self.update)

    def update(self, users, roles: dict) -> None:
        """The effective users and roles changed (ACL_UPDATE, a slave's metadata sync, the
        start): rebuild the Acl and the verifiers, and re-resolve every user connection by
        its name -- new rights at once; a deleted user or a changed password logs it out."""
        verifiers, verifiers512 = {}, {}
        for u in users:
            try:
                verifiers[u.name] = parse_verifier(u.scram)
                if u.scram512:
                    verifiers512[u.name] = parse_verifier(u.scram512, SHA512)
            except ValueError as e:  # validated where it was made: only a hand-edited file
                log.error("user %r: %s; it cannot log in", u.name, e)
        self.acl = acl.Acl(roles, users)
        self.verifiers, self.verifiers512 = verifiers, verifiers512
        self._secret = fake_salt_secret(verifiers)
        for conn in list(self._sessions):
            st = conn.auth
            if st is None or st.user is None:
                continue
            if st.verifier not in (verifiers.get(st.user), verifiers512.get(st.user)):
                conn.principal = None  # deleted, or its password changed: authenticate again
                st.user = st.verifier = None
                conn.opened_at = time.monotonic()  # a fresh auth deadline: it may log in again
                self._sessions.discard(conn)
                log.info("%s: user logged out (deleted or its password changed)", conn.peer)
            else:
                conn.principal = self.acl.principal(st.user)
            st.pub_ok.clear()

    # --- connections ---------------------------------------------------------------------------

    def on_connect(self, conn, member: str | None) -> None:
        """`member`: the member id the peer's certificate proves (TLS), or None."""
        conn.auth = AuthState()
        if not self.secure:
            conn.principal = acl.ANONYMOUS
        elif member is not None:
            if member in self.members:
                conn.member = member
                conn.principal = acl.Acl.member(member)
            else:
                self.refused(conn, f"a certificate for {member!r}, not a member of this group: "
                                   "no member rights, it must authenticate as a user")

    # --- requests ------------------------------------------------------------------------------

    def gate(self, conn, f: fr.Frame) -> bool:
        """True if the request was refused (answered or dropped) here."""
        code = f.code
        p = conn.principal
        if code == Req.AUTH:
            self._auth(conn, f)
            return True
        if p is None:
            if code == Req.RAFT:
                self.refused(conn, "a RAFT frame before authenticating: dropped")
                return True
            self.unauthenticated(conn, f, "authenticate first (SCRAM-SHA-256: the client needs a user "
                                 "name and password, see README 'Security')")
            return True
        if code in MEMBER_ONLY and self.secure and p.member is None:
            self.refused(conn, f"a RAFT frame from {p}, not a group member: dropped")
            return True
        what = ADMIN_ONLY.get(code)
        if what is not None and not p.admin:
            conn.respond(f, Code.NO_PERMISSION, error=acl.may_admin(p, what))
            return True
        return False

    @staticmethod
    def unauthenticated(conn, f: fr.Frame, error: str) -> None:
        """Answer a request that needs a proven identity the connection does not have
        AUTH_FAILED, counted as a failed login: AUTH_FAILURES_MAX of them close the connection
        (a peer that keeps asking without proving who it is is not a client)."""
        conn.respond(f, Code.AUTH_FAILED, error=error)
        st = conn.auth
        st.failures += 1
        if st.failures >= AUTH_FAILURES_MAX:
            conn.close()  # after the answer (or CLOSE_GRACE_S for a peer that does not read)

    @staticmethod
    def require(why: str | None) -> None:
        """Raise Denied(NO_PERMISSION) if a may_* check gave a reason."""
        if why is not None:
            raise Denied(Code.NO_PERMISSION, why)

    def may_pub(self, conn, topic: str) -> str | None:
        ok = conn.auth.pub_ok
        if topic in ok:
            return None
        why = acl.may_pub(conn.principal, topic)
        if why is None and len(ok) < 1024:
            ok.add(topic)
        return why

    def refused(self, conn, what: str, kind: str | None = None) -> None:
        """Log a refusal; refusals of one `kind` (default: the same words) at most once per
        REFUSAL_LOG_S, saying how many were not logged in between."""
        self._log.warning(kind or what, "refused from %s: %s", conn.peer, what)

    # --- SCRAM ---------------------------------------------------------------------------------

    def _auth(self, conn, f: fr.Frame) -> None:
        if not self.secure:  # insecure: true -- nothing to prove
            return conn.respond(f, Code.SUCCESS, jsonbody.encode(AuthStep("", True)))
        try:
            req = jsonbody.decode(Auth, f.body)
        except BadRequest as e:
            req = None
            bad = e
        if req is None:
            conn.auth.failures += 1
            conn.respond(f, Code.BAD_REQUEST, error=str(bad))
            if conn.auth.failures >= AUTH_FAILURES_MAX:
                conn.close()
            return
        try:
            reply, done = self.sasl_step(conn, req.mechanism, req.message)
        except AuthFailed as e:
            conn.respond(f, Code.AUTH_FAILED, error=str(e))
            if conn.auth.failures >= AUTH_FAILURES_MAX:
                conn.close()  # after the answer (or CLOSE_GRACE_S for a peer that does not read)
            return
        conn.respond(f, Code.SUCCESS, jsonbody.encode(AuthStep(reply, done)))

    def sasl_step(self, conn, mechanism: str, message: str) -> tuple[str, bool]:
        """One step of a connection's SCRAM exchange, for every protocol (the native AUTH,
        Kafka's SaslAuthenticate): (the server's message, whether the exchange is over and
        `conn.principal` set). SCRAM-SHA-256, or SCRAM-SHA-512 for users that have its
        verifier. Raises AuthFailed, counted in conn.auth.failures (the caller closes the
        connection at AUTH_FAILURES_MAX) and logged."""
        st = conn.auth
        try:
            if st.exchange is None:
                table = {MECHANISM: self.verifiers, SHA512: self.verifiers512}.get(mechanism)
                if table is None:
                    raise AuthFailed(f"mechanism {mechanism!r} is not supported: use SCRAM-SHA-256")
                st.exchange = ServerExchange(table, self._secret, mechanism)
            reply, done = st.exchange.step(message)
        except AuthFailed as e:
            st.failures += 1
            claimed = st.exchange.claimed if st.exchange is not None else None
            st.exchange = None
            if claimed is not None and len(claimed) > 64:  # a peer's words: bounded in the log
                claimed = claimed[:64] + "..."
            self.refused(conn, f"authentication failed{f' for user {claimed!r}' if claimed else ''}: {e}",
                         kind="authentication failed")
            raise
        if done:
            user, used, mech = st.exchange.user, st.exchange.verifier, st.exchange.mechanism
            st.exchange = None
            current = {MECHANISM: self.verifiers, SHA512: self.verifiers512}[mech].get(user)
            if self.acl.principal(user) is None or current != used:
                # deleted, or its password changed, while this exchange ran: the proof was
                # checked against a verifier that no longer holds
                st.failures += 1
                raise AuthFailed("unknown user or wrong password")
            conn.principal = self.acl.principal(user)
            st.pub_ok.clear()
            st.user, st.verifier = user, used
            self._sessions.add(conn)
            log.debug("%s authenticated as %r", conn.peer, user)
        return reply, done
