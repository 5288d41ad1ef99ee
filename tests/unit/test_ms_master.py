"""The master's replication state machine (replication/master_slave/master.py)."""

from broker.protocol.codes import Code
from replication.master_slave.master import MasterConfig, MasterCore

MiB = 1 << 20


def core(**kw) -> MasterCore:
    return MasterCore(MasterConfig(**{"ack_timeout_ms": 100, "housekeeping_ms": 500, **kw}))


def test_sync_master_refuses_without_an_in_sync_slave():
    m = core(in_sync_replicas=2, fallbehind_max_bytes=1000)
    assert "no slave is connected" in m.admit()
    m.connect("s1", "h:1", 0)
    assert "no report yet" in m.admit()
    m.local(5000, 5000)
    m.report("s1", 3000, 1)
    assert "2000 bytes behind" in m.admit()  # lags more than fallbehind_max_bytes
    m.report("s1", 4500, 2)
    assert m.admit() is None and m.in_sync_count() == 2


def test_send_is_released_when_master_and_enough_slaves_hold_it():
    m = core(in_sync_replicas=3)
    for s in ("s1", "s2"):
        m.connect(s, "h", 0)
    m.local(1000, 1000)
    assert m.wait(1000, 0, "a")
    m.local(2000, 1000)  # flush: sync, not yet fsynced here
    assert m.wait(2000, 0, "b")
    assert m.report("s1", 2000, 1) == []
    assert m.report("s2", 1000, 1) == ["a"]  # both slaves hold 1000
    assert m.report("s2", 2000, 2) == []  # ... and 2000, but the master has not fsynced it
    assert m.local(2000, 2000) == ["b"]
    assert m.confirm == 2000 and not m.waiting


def test_timeouts_name_what_was_missing():
    m = core(in_sync_replicas=2)
    m.connect("s1", "h", 0)
    m.local(100, 100)
    m.wait(100, 0, "slow-slave")
    m.local(200, 100)
    m.wait(200, 0, "slow-disk")
    m.report("s1", 200, 50)  # released "slow-slave" (100 is held by both)
    expired, silent = m.tick(150)
    assert [(t, c) for t, c, _ in expired] == [("slow-disk", Code.FLUSH_DISK_TIMEOUT)]
    m.local(300, 300)
    m.wait(300, 160, "late")
    expired, _ = m.tick(400)
    assert [(t, c) for t, c, _ in expired] == [("late", Code.FLUSH_SLAVE_TIMEOUT)]
    assert silent == [] and m.tick(551)[1] == ["s1"]  # no report for housekeeping_ms


def test_watermark_never_goes_back_and_async_follows_the_disk():
    m = core(in_sync_replicas=2)
    m.connect("s1", "h", 0)
    m.local(500, 500)
    m.report("s1", 500, 1)
    assert m.confirm == 500
    m.disconnect("s1")
    m.connect("s1", "h", 2)
    m.report("s1", 0, 3)  # a slave that started over
    assert m.confirm == 500
    a = core(sync=False)
    a.local(800, 700)
    assert a.confirm == 700 and a.admit() is None and not a.wait(700, 0, "x")


def test_auto_degrade_shrinks_to_min_in_sync_replicas():
    m = core(in_sync_replicas=3, min_in_sync_replicas=2, auto_degrade=True)
    assert m.required() == 2 and m.admit() is not None  # needs 2, has only the master
    m.connect("s1", "h", 0)
    m.local(100, 100)
    m.report("s1", 100, 1)
    assert m.required() == 2 and m.admit() is None
    m.connect("s2", "h", 1)
    m.report("s2", 100, 2)
    assert m.required() == 3
    strict = core(in_sync_replicas=3)
    strict.connect("s1", "h", 0)
    strict.report("s1", 0, 1)
    assert strict.required() == 3 and strict.admit() is not None


def test_fail_all_and_status():
    m = core(in_sync_replicas=2, fallbehind_max_bytes=MiB)
    m.connect("s1", "h:1", 0)
    m.local(4000, 4000)
    for t in range(0, 5001, 1000):
        m.report("s1", 400 * t // 1000, t)
    st = m.status(5000)
    s1 = st["slaves"]["s1"]
    assert s1["ack_offset"] == 2000 and s1["lag_bytes"] == 2000 and s1["in_sync"]
    assert 350 <= s1["transfer_rate_bytes_per_s"] <= 450
    assert st["in_sync_count"] == 2 and st["required_replicas"] == 2
    m.wait(4000, 5000, "t1")
    assert m.fail_all() == ["t1"] and not m.waiting


def test_a_slave_gone_quiet_stops_counting_within_two_heartbeats():
    """Issue 13, item 9: behind a partition a slave keeps its TCP connection but reports
    nothing; the master must refuse sends (SLAVE_NOT_AVAILABLE, not stored) once it has been
    quiet for silent_ms, long before housekeeping drops the connection."""
    m = core(in_sync_replicas=2, silent_ms=2000, housekeeping_ms=20_000)
    m.connect("s1", "h", 0)
    m.local(100, 100)
    m.report("s1", 100, 1000)
    assert m.admit(2900) is None  # heard from 1.9 s ago
    why = m.admit(3100)
    assert why is not None and "s1 (silent for 2100 ms)" in why
    assert m.tick(3100)[1] == []  # still connected: dropped only after housekeeping_ms
    m.report("s1", 100, 3200)  # it speaks again: in sync again
    assert m.admit(3300) is None


def test_an_async_master_answers_alone_unless_it_fences_itself():
    """RocketMQ's ASYNC_MASTER takes sends with no slave at all (the default). With
    async_fence_replicas it takes a send only while that many replicas (itself counted) hold
    its log to within fallbehind_max_bytes and reported within silent_ms, and STATUS says
    why it refuses (issue 39 item 4)."""
    plain = core(sync=False)
    assert plain.admit(0) is None and plain.status(0)["self_fenced"] is None
    m = core(sync=False, async_fence_replicas=2, fallbehind_max_bytes=1000, silent_ms=50)
    assert "self-fenced: 1 of the 2" in m.admit(0) and "no slave is connected" in m.admit(0)
    m.connect("s1", "h:1", 0)
    m.local(5000, 5000)
    m.report("s1", 3000, 1)
    assert "2000 bytes behind" in m.admit(1)
    m.report("s1", 4500, 2)
    assert m.admit(2) is None and m.status(2)["self_fenced"] is None
    assert m.wait(5000, 2, "a") is False  # still answered at once: ASYNC
    assert "silent for 51 ms" in m.admit(53) and m.status(53)["self_fenced"].startswith("self-fenced")
    m.report("s1", 5000, 60)
    assert m.admit(60) is None


def test_the_self_fence_is_a_broker_setting_with_a_majority_quorum(tmp_path):
    """ha_async_self_fence (broker.yaml) reaches the master's rules: a majority of the group
    (restart_quorum: it meets every promotion quorum) and one send's largest append as the
    bound past the window; off by default, and never in SYNC mode's admit."""
    from broker.config import BrokerConfig
    from replication.master_slave.driver import entry_bytes_bound, master_config

    peers = [{"id": f"n{i}", "address": f"127.0.0.1:{20000 + 2 * i}"} for i in range(5)]
    base = dict(data_dir=tmp_path, insecure=True, mode="master-slave", node_id="n0", peers=peers,
                listen="127.0.0.1:20000",
                ha_replication="async")
    off = master_config(BrokerConfig(**base))
    assert off.async_fence_replicas == 0 and not off.sync
    cfg = BrokerConfig(**base, ha_async_self_fence=True)
    on = master_config(cfg)
    assert on.async_fence_replicas == 3 and on.append_bytes_max == entry_bytes_bound(cfg) > 0
    assert "self-fenced: 1 of the 3" in MasterCore(on).admit(0)
