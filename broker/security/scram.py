"""SCRAM-SHA-256 (RFC 5802, RFC 7677): how a client proves its password to a broker.

Why SCRAM and not HMAC-signed requests: SCRAM authenticates a connection once (two round
trips when it opens), so the data path pays nothing per request -- signing every request
with a timestamp and a nonce would cost an HMAC per message and a replay cache on the broker.
The broker keeps only a salted verifier (StoredKey, ServerKey), never the password, so a
leaked broker config does not give away passwords; the server's final message proves the
broker knew the verifier (mutual authentication); the nonces of both sides go into the proof,
so a recorded exchange cannot be replayed. Over TLS the channel is private as well.

The exchange itself (message syntax, proofs, error names) is scramp's; this module keeps the
verifier format and the two state machines the broker and the client drive:

    client                                  broker
    AUTH {mechanism, message: client-first} ->
                                            <- SUCCESS {message: server-first, done: false}
    AUTH {message: client-final}            ->
                                            <- SUCCESS {message: server-final, done: true}
                                               or AUTH_FAILED (wrong password, unknown user)

Verifier format (what `users[].scram` holds in the broker config), as PostgreSQL writes it:

    SCRAM-SHA-256$<iterations>:<salt, base64>$<StoredKey, base64>:<ServerKey, base64>
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import scramp

MECHANISM = "SCRAM-SHA-256"
SHA512 = "SCRAM-SHA-512"  # Kafka clients' other SCRAM (a user's second verifier, `scram512`)
ITERATIONS = 4096  # RFC 7677's minimum; the client's PBKDF2 runs once per connection
_MECH = scramp.ScramMechanism(MECHANISM)
_MECHS = {MECHANISM: _MECH, SHA512: scramp.ScramMechanism(SHA512)}
_KEY_BYTES = {MECHANISM: 32, SHA512: 64}
_HASH = {MECHANISM: hashlib.sha256, SHA512: hashlib.sha512}


class AuthFailed(Exception):
    """Authentication failed; the message is safe to send back (it never says whether the
    user exists)."""


def make_verifier(password: str, iterations: int = ITERATIONS, mechanism: str = MECHANISM) -> str:
    salt, stored, server, it = _MECHS[mechanism].make_auth_info(password, iteration_count=iterations)
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"{mechanism}${it}:{b64(salt)}${b64(stored)}:{b64(server)}"


def parse_verifier(text: str, mechanism: str = MECHANISM) -> tuple[bytes, bytes, bytes, int]:
    """(salt, stored_key, server_key, iterations) of a `mechanism` verifier; ValueError naming
    what is wrong."""
    try:
        mech, it_salt, keys = text.split("$")
        it, salt = it_salt.split(":")
        stored, server = keys.split(":")
        if mech != mechanism:
            raise ValueError(f"mechanism {mech!r} is not {mechanism}")
        out = (base64.b64decode(salt, validate=True), base64.b64decode(stored, validate=True),
               base64.b64decode(server, validate=True), int(it))
    except ValueError as e:
        raise ValueError(f"not a SCRAM verifier ({mechanism}$<iterations>:<salt>$<StoredKey>:<ServerKey>): {e}") from None
    n = _KEY_BYTES[mechanism]
    if out[3] < ITERATIONS or len(out[1]) != n or len(out[2]) != n:
        raise ValueError(f"a {mechanism} verifier needs >= {ITERATIONS} iterations and {n}-byte keys")
    return out


class ServerExchange:
    """One broker-side exchange. `step(message)` returns (reply, done); raises AuthFailed.
    After done, `user` names who authenticated."""

    def __init__(self, verifiers: dict[str, tuple[bytes, bytes, bytes, int]], secret: bytes,
                 mechanism: str = MECHANISM):
        self._verifiers = verifiers
        self._secret = secret
        self.mechanism = mechanism
        self._server = _MECHS[mechanism].make_server(self._lookup)
        self._claimed: str | None = None
        self._known = False
        self.verifier = None
        self.user: str | None = None
        self.stage = 0
        self._firsts = ("", "")  # the client-first-message-bare and the server-first-message

    @property
    def claimed(self) -> str | None:
        """The user name the client-first message claimed (for the log), None before it."""
        return self._claimed

    def _lookup(self, name: str):
        self._claimed = name
        v = self._verifiers.get(name)
        self._known = v is not None
        self.verifier = v  # what the proof is checked against: the caller compares it at the end
        if v is not None:
            return v
        # an unknown user gets a stable made-up salt: the first answer does not tell
        # whether the user exists; the proof fails at the next step like a wrong password
        fake = hmac.new(self._secret, name.encode(), _HASH[self.mechanism]).digest()
        return fake, fake, fake, ITERATIONS

    def step(self, message: str) -> tuple[str, bool]:
        stage = self.stage
        try:
            if self.stage == 0:
                self._server.set_client_first(message)
                self.stage = 1
                self._firsts = (message.split(",", 2)[2], self._server.get_server_first())  # (bare, server's)
                return self._firsts[1], False
            if self.stage == 1:
                self.stage = 2
                doubled = self._doubled_nonce(message)
                if doubled is not None:
                    return self._final_with_doubled_nonce(message, doubled)
                self._server.set_client_final(message)
                if not self._known:
                    raise AuthFailed("unknown user or wrong password")
                self.user = self._claimed
                return self._server.get_server_final(), True
        except scramp.ScramException as e:
            self.stage = 2
            if stage == 1:
                raise AuthFailed("unknown user or wrong password") from None
            raise AuthFailed(f"not a {self.mechanism} client-first message: {e}") from None
        raise AuthFailed("the exchange is over; open a new connection")


    def _doubled_nonce(self, message: str) -> str | None:
        """librdkafka before 2.6.1 (Debian 12's 2.0.2, under kcat) sends the client nonce
        twice in client-final's r= (its own, then the server's, which starts with it:
        confluentinc/librdkafka#4895); Apache Kafka takes a nonce that ends with the server's
        (apache/kafka@0a00456, 3.8.1). Taken here only in that exact form: the client nonce,
        then the whole server nonce. The nonce as sent, or None for any other message."""
        def attrs(text: str) -> dict:
            return dict(kv.split("=", 1) for kv in text.split(",") if "=" in kv)
        bare, server_first = self._firsts
        r, nonce, c_nonce = attrs(message).get("r"), attrs(server_first).get("r"), attrs(bare).get("r")
        if r is None or nonce is None or c_nonce is None or r == nonce or r != c_nonce + nonce:
            return None
        return r

    def _final_with_doubled_nonce(self, message: str, r: str) -> tuple[str, bool]:
        """RFC 5802's proof check over the client-final as it was sent (its r= included)."""
        without_proof, sep, proof = message.rpartition(",p=")
        attrs = dict(kv.split("=", 1) for kv in without_proof.split(",") if "=" in kv)
        if not sep or attrs.get("c") != "biws" or not self._known:
            raise AuthFailed("unknown user or wrong password")
        auth = f"{self._firsts[0]},{self._firsts[1]},{without_proof}".encode()
        _, stored_key, server_key, _ = self.verifier
        hf = _HASH[self.mechanism]
        signature = hmac.new(stored_key, auth, hf).digest()
        try:
            given = base64.b64decode(proof, validate=True)
        except ValueError:
            raise AuthFailed("unknown user or wrong password") from None
        if len(given) != len(signature) or not hmac.compare_digest(
                hf(bytes(a ^ b for a, b in zip(given, signature))).digest(), stored_key):
            raise AuthFailed("unknown user or wrong password")
        self.user = self._claimed
        return "v=" + base64.b64encode(hmac.new(server_key, auth, hf).digest()).decode(), True


class ClientExchange:
    """One client-side exchange: first() gives client-first; step(server-first) gives
    client-final; finish(server-final) checks the broker's signature (raises AuthFailed)."""

    def __init__(self, username: str, password: str):
        self._client = scramp.ScramClient([MECHANISM], username, password)

    def first(self) -> str:
        return self._client.get_client_first()

    def step(self, server_first: str) -> str:
        try:
            self._client.set_server_first(server_first)
            return self._client.get_client_final()
        except scramp.ScramException as e:
            raise AuthFailed(f"the broker's SCRAM answer is not valid: {e}") from None

    def finish(self, server_final: str) -> None:
        try:
            self._client.set_server_final(server_final)
        except scramp.ScramException as e:
            raise AuthFailed(f"the broker could not prove it knows this user's verifier: {e}") from None


def new_secret() -> bytes:
    return os.urandom(32)


def fake_salt_secret(verifiers: dict) -> bytes:
    """The key of unknown users' made-up salts: the same on every member (they share the users'
    verifiers), unknown to outsiders (the verifiers are secret), so asking two members, or one
    before and after a restart, for an unknown user's salt does not tell it from a real one."""
    h = hashlib.sha256(b"tidelog fake salt")
    for name in sorted(verifiers):
        salt, stored, server, it = verifiers[name]
        h.update(name.encode() + b"\0" + stored + server)
    return h.digest()
