"""broker/kafka/codec.py: any declared message round-trips at every version, flexible or not;
arbitrary bytes decode to a message or a KafkaDecodeError naming a field, never anything else."""

import uuid

from hypothesis import given, settings, strategies as st

from broker.kafka.codec import F, KafkaDecodeError, decode, encode, message, uvarint

M = message("Example", "0-4", "3+",
            F("transactional_id", "string", "1+", null=True),
            F("acks", "int16"),
            F("flag", "bool", "2+"),
            F("ids", "[int32]"),
            F("topics", (F("name", "string"),
                         F("parts", (F("index", "int32"), F("records", "records", null=True))),
                         F("topic_id", "uuid", "2+"))),
            F("blob", "bytes", "0+"),
            F("note", "string", "3+", tag=0, default="none"),
            F("epoch", "int64", "3+", tag=1, default=-1))

names = st.text(max_size=20)
part = st.fixed_dictionaries({"index": st.integers(-2**31, 2**31 - 1),
                              "records": st.one_of(st.none(), st.binary(max_size=50))})
topic = st.fixed_dictionaries({"name": names, "parts": st.lists(part, max_size=3),
                               "topic_id": st.uuids()})
obj = st.fixed_dictionaries({
    "transactional_id": st.one_of(st.none(), names), "acks": st.integers(-2**15, 2**15 - 1),
    "flag": st.booleans(), "ids": st.lists(st.integers(-2**31, 2**31 - 1), max_size=5),
    "topics": st.lists(topic, max_size=3), "blob": st.binary(max_size=40),
    "note": names, "epoch": st.integers(-2**63, 2**63 - 1)})


def present(o: dict, v: int) -> dict:
    """What survives version v: fields outside it come back as their defaults."""
    out = dict(o)
    if v < 1:
        out["transactional_id"] = None
    if v < 2:
        out["flag"] = False
        out["topics"] = [{**t, "topic_id": uuid.UUID(int=0)} for t in o["topics"]]
    if v < 3:
        out["note"], out["epoch"] = "none", -1
    return out


@settings(max_examples=300, deadline=None)
@given(obj, st.integers(0, 4))
def test_round_trip_at_every_version(o, v):
    got = decode(M, v, encode(M, v, o))
    want = present(o, v)
    for t in got["topics"]:
        for p in t["parts"]:
            p["records"] = None if p["records"] is None else bytes(p["records"])
    assert got == want


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 4))
def test_any_bytes_decode_or_name_the_field(data, v):
    try:
        decode(M, v, data)
    except KafkaDecodeError as e:
        assert str(e)


def test_unknown_tags_are_skipped_and_lies_refused():
    base = encode(M, 3, {"acks": 1})
    assert base.endswith(b"\x00")  # no tagged fields written for defaults
    with_unknown = base[:-1] + uvarint(1) + uvarint(9) + uvarint(2) + b"xy"
    assert decode(M, 3, with_unknown)["acks"] == 1
    try:
        decode(M, 3, base[:-1] + uvarint(1) + uvarint(9) + uvarint(200) + b"xy")
    except KafkaDecodeError as e:
        assert "tag 9" in str(e)
    else:
        raise AssertionError("a tagged field longer than the message was taken")
    # an array that claims a million items in a few bytes is refused before allocating
    lie = encode(M, 0, {"acks": 1})[:2] + (10**6).to_bytes(4, "big", signed=True)
    try:
        decode(M, 0, lie)
    except KafkaDecodeError as e:
        assert "ids" in str(e)
    else:
        raise AssertionError("a lying array count was taken")


# --- the declared APIs (broker/kafka/apis.py) -------------------------------------------------

from broker.kafka import apis  # noqa: E402


def test_every_api_round_trips_its_defaults_at_every_version():
    for api in apis.APIS.values():
        for v in range(api.lo, api.hi + 1):
            for m in (api.request, api.response):
                assert encode(m, v, decode(m, v, encode(m, v, {}))) == encode(m, v, {}), (m.name, v)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(sorted(apis.APIS)), st.integers(0, 12), st.binary(max_size=300))
def test_every_request_decoder_takes_any_bytes(key, v, data):
    api = apis.APIS[key]
    try:
        decode(api.request, v, data)
    except KafkaDecodeError as e:
        assert str(e)


def test_request_header_v1_and_v2():
    body = encode(apis.METADATA_REQUEST, 9, {"topics": None})
    flexible = (3).to_bytes(2, "big") + (9).to_bytes(2, "big") + (7).to_bytes(4, "big") + \
        (3).to_bytes(2, "big") + b"cli" + b"\x00" + body
    h = apis.decode_request_header(flexible)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 9, 7, "cli")
    assert decode(apis.METADATA_REQUEST, 9, flexible, h.body_at)["topics"] is None
    plain = (3).to_bytes(2, "big") + (4).to_bytes(2, "big") + (8).to_bytes(4, "big") + b"\xff\xff" + encode(apis.METADATA_REQUEST, 4, {"topics": []})
    h = apis.decode_request_header(plain)
    assert h.client_id is None and decode(apis.METADATA_REQUEST, 4, plain, h.body_at)["topics"] == []
    # ApiVersions answers with a v0 response header whatever its version (a client that asked
    # for a version we do not have must still read the answer)
    assert apis.response_header(18, 3, 5) == (5).to_bytes(4, "big")
    assert apis.response_header(3, 9, 5) == (5).to_bytes(4, "big") + b"\x00"
