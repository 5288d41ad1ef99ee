"""broker/security/scram.py's server side against a client that is not ours: the nonce quirk of
librdkafka before 2.6.1, computed here by hand as that client does (RFC 5802)."""

import base64
import hashlib
import hmac as hm

import pytest

from broker.security.scram import AuthFailed, ServerExchange, make_verifier, parse_verifier
def test_the_doubled_client_nonce_of_librdkafka_before_2_6_1_is_taken_in_that_form_only():
    """librdkafka < 2.6.1 (Debian's kcat) sends r=<client nonce><server nonce> in
    client-final (confluentinc/librdkafka#4895); Apache Kafka accepts it. The proof is checked
    over the message as sent; a wrong password, or any other nonce, is still refused."""
    verifiers = {"u": parse_verifier(make_verifier("pw"))}

    def exchange(password: str, nonce_of=lambda c, s: c + s):
        srv = ServerExchange(verifiers, b"s" * 32)
        first, _ = srv.step("n,,n=u,r=cnonce123")
        attrs = dict(kv.split("=", 1) for kv in first.split(","))
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = hm.new(salted, b"Client Key", hashlib.sha256).digest()
        without = f"c=biws,r={nonce_of('cnonce123', attrs['r'])}"
        auth = f"n=u,r=cnonce123,{first},{without}".encode()
        sig = hm.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, sig))).decode()
        return srv.step(f"{without},p={proof}"), salted, auth

    (final, done), salted, auth = exchange("pw")
    server_key = hm.new(salted, b"Server Key", hashlib.sha256).digest()
    assert done and final == "v=" + base64.b64encode(hm.new(server_key, auth, hashlib.sha256).digest()).decode()
    with pytest.raises(AuthFailed):
        exchange("wrong")
    with pytest.raises(AuthFailed):
        exchange("pw", nonce_of=lambda c, s: "x" + s)  # ends with the server nonce, but not that form


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_each_mechanism_checks_its_own_verifier(mechanism):
    """A SCRAM-SHA-512 exchange (Kafka clients) against the user's scram512 verifier; a verifier
    of the other hash is refused when parsed as this one."""
    import scramp

    from broker.security.scram import SHA512

    verifiers = {"u": parse_verifier(make_verifier("pw", mechanism=mechanism), mechanism)}
    for password, ok in (("pw", True), ("nope", False)):
        client = scramp.ScramClient([mechanism], "u", password)
        srv = ServerExchange(verifiers, b"s" * 32, mechanism)
        first, _ = srv.step(client.get_client_first())
        client.set_server_first(first)
        if ok:
            final, done = srv.step(client.get_client_final())
            client.set_server_final(final)
            assert done and srv.user == "u"
        else:
            with pytest.raises(AuthFailed):
                srv.step(client.get_client_final())
    other = "SCRAM-SHA-256" if mechanism == SHA512 else SHA512
    with pytest.raises(ValueError, match="mechanism"):
        parse_verifier(make_verifier("pw", mechanism=other), mechanism)
