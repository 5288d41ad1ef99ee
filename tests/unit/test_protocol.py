import struct

import pytest

from broker.protocol import admin as ap
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol import pull as pp
from broker.protocol import send as sp
from broker.protocol import topics as tp
from broker.protocol.codes import BadRequest, Code, Req


def frames_of(decoder, data, step):
    out = []
    for i in range(0, len(data), step):
        out += decoder.feed(data[i:i + step])
    return out


@pytest.mark.parametrize("step", [1, 2, 7, 16, 17, 100, 10**6])
def test_decoder_reassembles_any_split(step):
    wire = b"".join(fr.encode(Req.SEND, i, b"body-%d" % i * i, {"k": "v"} if i % 2 else None)
                    for i in range(1, 20))
    got = frames_of(fr.FrameDecoder(), wire, step)
    assert [f.corr_id for f in got] == list(range(1, 20))
    assert all(bytes(f.body) == b"body-%d" % f.corr_id * f.corr_id for f in got)
    assert got[0].headers == {"k": "v"} and got[1].headers == {}


def test_response_flags_and_fast_ok_frame():
    r = sp.SendResponse(3, 4, 5, 6, 7)
    fast = sp.encode_ok_frame(99, 1, r)
    assert fast == fr.encode_response(Code.SUCCESS, 99, sp.encode_response(r))
    f = fr.FrameDecoder().feed(fast)[0]
    assert f.is_response and not f.oneway and sp.decode_response(f.body) == r


def test_decoder_errors_name_the_problem():
    d = fr.FrameDecoder(frame_bytes_max=1000)
    assert d.feed(struct.pack(">IHBBHIH", 5000, fr.MAGIC, 1, 0, 10, 77, 0)) == []
    assert d.error.code == Code.FRAME_TOO_LARGE and d.error.corr_id == 77
    assert d.feed(fr.encode(10, 1)) == []  # nothing after an error
    d = fr.FrameDecoder()
    good = fr.encode(10, 1, b"x")
    assert len(d.feed(good + b"HTTP/1.1 200 OK\r\n")) == 1 and d.error.code == Code.BAD_FRAME
    d = fr.FrameDecoder()
    d.feed(good[:-1])
    assert d.eof_error().corr_id == 1 and "stream ended" in str(d.eof_error())
    assert fr.FrameDecoder().eof_error() is None


def test_large_frame_in_many_pieces_is_joined_once():
    body = bytes(range(256)) * 4096  # 1 MiB
    wire = fr.encode(10, 5, body)
    d = fr.FrameDecoder()
    got = frames_of(d, wire, 4096)
    assert len(got) == 1 and bytes(got[0].body) == body


@pytest.mark.parametrize("raw", [b"\x00\x01", b"\x00\x01\x05abc", b"\x00\x01\x01a\x00\x09xy",
                                 b"\x00\x00trailing"])
def test_bad_header_maps(raw):
    with pytest.raises(fr.FrameError, match="header map"):
        fr.decode_headers(raw)


def test_send_round_trip_and_corruption():
    r = sp.SendRequest("orders", 3, 9, 123, b"\7" * 16, b"KEYS\x01a\x02", b"payload")
    d = sp.decode_request(sp.encode_request(r))
    assert (d.topic, d.queue_id, d.flags, d.born_ts_ms, d.msg_id) == ("orders", 3, 9, 123, b"\7" * 16)
    assert bytes(d.properties) == r.properties and bytes(d.body) == r.body
    raw = sp.encode_request(r)
    for bad in (raw[:10], raw[:36], raw[:32] + b"\x00" + raw[33:]):
        with pytest.raises(BadRequest):
            sp.decode_request(bad)
    with pytest.raises(BadRequest, match="UTF-8"):
        sp.decode_request(raw[:35] + b"\xff\xfe" + raw[37:])


def test_batch_round_trip_and_corruption():
    b = sp.SendBatchRequest("t", 2, [sp.BatchMessage(0, 1, b"\1" * 16, b"", b"a"),
                                     sp.BatchMessage(1, 2, b"\2" * 16, b"p", b"bb")])
    raw = sp.encode_batch_request(b)
    assert sp.decode_batch_request(raw) == b
    with pytest.raises(BadRequest):
        sp.decode_batch_request(raw[:-1])
    with pytest.raises(BadRequest, match="trailing"):
        sp.decode_batch_request(raw + b"x")
    resp = sp.SendBatchResponse(2, 10, 20, 30, [100, 200])
    assert sp.decode_batch_response(sp.encode_batch_response(resp)) == resp


def test_pull_round_trip_and_tags():
    r = pp.PullRequest("t", 1, 42, 32, 1 << 20, 5000, "a||b")
    assert pp.decode_request(pp.encode_request(r)) == r
    with pytest.raises(BadRequest):
        pp.decode_request(pp.encode_request(r)[:-1])
    resp = pp.PullResponse(5, 0, 9, 0, b"")
    assert pp.decode_response(pp.encode_response(resp)) == resp
    assert pp.parse_tags("*") is None and pp.parse_tags("a || b") == {"a", "b"}


def test_json_bodies_validate_and_name_the_field():
    c = jsonbody.decode(tp.CreateTopic, jsonbody.encode(tp.CreateTopic("t", 8)))
    assert c == tp.CreateTopic("t", 8)
    with pytest.raises(BadRequest, match="CreateTopic: write_queues"):
        jsonbody.decode(tp.CreateTopic, b'{"topic": "t", "write_queues": "lots"}')
    with pytest.raises(BadRequest, match="TopicName"):
        jsonbody.decode(tp.TopicName, b"not json")


def test_group_bodies_round_trip_and_name_the_field():
    info = ap.GroupInfo("g", [ap.GroupTopic("t", 2, [ap.GroupQueue(0, 10, 4, 6), ap.GroupQueue(1, 3, -1, None)])],
                        [ap.GroupMember("host@1@ab", "127.0.0.1:5000", 120, ["t"])])
    assert jsonbody.decode(ap.GroupInfo, jsonbody.encode(info)) == info
    assert jsonbody.decode(ap.DescribeGroup, b'{"group": "g"}') == ap.DescribeGroup("g", None)
    with pytest.raises(BadRequest, match="DescribeGroup: group"):
        jsonbody.decode(ap.DescribeGroup, b'{"topic": "t"}')
    # new request codes only: nothing an older build already speaks changes meaning
    assert (Req.LIST_GROUPS, Req.DESCRIBE_GROUP) == (61, 62) and Code.SUBSCRIPTION_GROUP_NOT_EXIST == 26


def test_group_view_owners_follow_the_consumers_allocation():
    from broker.client.admin import group_view

    info = ap.GroupInfo("g", [ap.GroupTopic("t", 5, [ap.GroupQueue(q, 10, 7, 3) for q in range(5)])],
                        [ap.GroupMember(m, "", 0, ["t"]) for m in ("a", "b")])
    v = group_view(info)
    assert [m["owns"] for m in v["members"]] == [{"t": [0, 1, 2]}, {"t": [3, 4]}]
    assert [q["owner"] for q in v["queues"]] == ["a", "a", "a", "b", "b"] and v["lag"] == 15


@pytest.mark.parametrize("read", [1, 5, 16, 1000, 70_000, 10**7])
def test_frame_reader_reads_in_place_whatever_the_read_sizes(read):
    bodies = [bytes([i % 256]) * (i * 997 % 200_000) for i in range(40)]
    wire = b"".join(fr.encode(Req.SEND, i, b) for i, b in enumerate(bodies))
    r = fr.FrameReader(capacity=128 << 10)
    got, pos = [], 0
    while pos < len(wire):
        buf = r.get_buffer(-1)
        n = min(len(buf), read, len(wire) - pos)
        buf[:n] = wire[pos:pos + n]
        pos += n
        got += [(f.corr_id, bytes(f.body)) for f in r.buffer_updated(n)]  # used before next read
    assert got == list(enumerate(bodies)) and r.eof_error() is None
    assert len(r.get_buffer(-1)) == 128 << 10  # shrank back after the big frames


def test_frame_reader_errors_and_eof():
    r = fr.FrameReader(frame_bytes_max=1000)
    buf = r.get_buffer(-1)
    head = struct.pack(">IHBBHIH", 5000, fr.MAGIC, 1, 0, 10, 3, 0)
    buf[:16] = head
    assert r.buffer_updated(16) == [] and r.error.code == Code.FRAME_TOO_LARGE
    r = fr.FrameReader()
    whole = fr.encode(10, 8, b"abc")
    r.get_buffer(-1)[:len(whole) - 1] = whole[:-1]
    assert r.buffer_updated(len(whole) - 1) == []
    assert r.eof_error().corr_id == 8
