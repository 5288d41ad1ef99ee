import threading

from broker.offsets import OffsetManager


def test_an_older_snapshot_never_overwrites_a_newer_one(tmp_path):
    om = OffsetManager(tmp_path / "o.json")
    om.commit("g", "t", {0: 5})
    old = om.snapshot()
    om.commit("g", "t", {0: 9})
    new = om.snapshot()
    om.write(new)
    om.write(old)  # a slower writer finishing last
    again = OffsetManager(tmp_path / "o.json")
    again.load()
    assert again.query("g", "t", [0, 1]) == {0: 9, 1: -1}


def test_concurrent_writers_leave_a_whole_file(tmp_path):
    om = OffsetManager(tmp_path / "o.json")
    snaps = []
    for i in range(50):
        om.commit("g", "t", {0: i})
        snaps.append(om.snapshot())
    threads = [threading.Thread(target=om.write, args=(s,)) for s in reversed(snaps)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    again = OffsetManager(tmp_path / "o.json")
    again.load()
    assert again.query("g", "t", [0]) == {0: 49}


def test_persist_writes_what_a_snapshot_still_in_flight_holds(tmp_path):
    """A periodic checkpoint takes a snapshot (clearing `dirty`) and writes it in the executor;
    a store checkpoint meanwhile calls persist() before moving the dispatched offset: it must
    find the offsets on disk when it returns, not skip because nothing is dirty."""
    from broker.offsets import OffsetManager

    m = OffsetManager(tmp_path / "consumer_offsets.json")
    m.commit("g", "t", {0: 7})
    in_flight = m.snapshot()  # taken, not written yet
    m.persist()
    again = OffsetManager(tmp_path / "consumer_offsets.json")
    again.load()
    assert again.query("g", "t", [0]) == {0: 7}
    m.write(in_flight)  # the late write of the older snapshot changes nothing
    again.load()
    assert again.query("g", "t", [0]) == {0: 7}
