"""topics.json: what a broker reloads is what it had, whatever the order of creates and
updates (each topic's line is kept encoded between saves)."""
import json

from hypothesis import given, settings, strategies as st

from broker.topics import TopicManager

NAMES = st.sampled_from(["a", "b", "c", "auto-1", "x_y", "q|1"])
OPS = st.lists(st.tuples(NAMES, st.integers(1, 8), st.integers(1, 8), st.sampled_from([2, 4, 6])),
               min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_reload_equals_what_was_set(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("topics") / "config" / "topics.json"
    tm = TopicManager(path, True, 4, 64)
    for name, w, r, perm in ops:
        tm.create(name, w, r, perm, update=True)
    data = json.loads(path.read_text())  # one JSON document
    assert [t["name"] for t in data["topics"]] == list(tm.topics)
    again = TopicManager(path, True, 4, 64)
    again.load()
    assert again.topics == tm.topics
    again.create("new", 2)  # a reloaded manager saves what it loaded, plus the change
    third = TopicManager(path, True, 4, 64)
    third.load()
    assert third.topics == {**tm.topics, "new": again.topics["new"]}


def test_one_topic_a_line(tmp_path):
    tm = TopicManager(tmp_path / "topics.json", True, 4, 64)
    for i in range(3):
        tm.get_or_auto_create(f"t{i}")
    lines = (tmp_path / "topics.json").read_text().splitlines()
    assert len(lines) == 5  # header, a line each, footer
    assert [json.loads(line.rstrip(","))["name"] for line in lines[1:4]] == ["t0", "t1", "t2"]
