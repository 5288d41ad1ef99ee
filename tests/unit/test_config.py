import pytest

from broker import config


def test_defaults_are_valid_and_mirror_rocketmq():
    c = config.from_dict({})
    assert c.segment_bytes == 1 << 30 and c.message_body_bytes_max == 4 << 20
    assert c.flush == "async" and c.delete_when == "04" and c.file_reserved_hours == 72


@pytest.mark.parametrize("data, msg", [
    ({"flush": "sometimes"}, "field 'flush'"),
    ({"flsh": "sync"}, "unknown field 'flsh' (did you mean 'flush'?)"),
    ({"listen": "nowhere"}, "field 'listen'"),
    ({"segment_bytes": 65536}, "segment_bytes (65536) must hold the largest entry"),
    ({"delete_when": "25"}, "not an hour"),
    ({"disk_usage_ratio_clean": 0.9, "disk_usage_ratio_force": 0.8}, "disk_usage_ratio_clean <="),
    ({"flush_interval_ms": 0}, "field 'flush_interval_ms'"),
])
def test_bad_values_name_the_field(data, msg):
    with pytest.raises(config.ConfigError) as e:
        config.from_dict(data, "broker.yaml")
    assert msg in str(e.value) and "broker.yaml" in str(e.value)


def test_load_resolves_data_dir_next_to_the_file(tmp_path):
    (tmp_path / "b.yaml").write_text("data_dir: data\nflush: sync\n")
    c = config.load(tmp_path / "b.yaml")
    assert c.data_dir == tmp_path / "data" and c.flush == "sync"
    (tmp_path / "bad.yaml").write_text("flush: [")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(tmp_path / "bad.yaml")
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load(tmp_path / "missing.yaml")


MS_PEERS = [{"id": "n0", "address": "127.0.0.1:7000"}, {"id": "n1", "address": "127.0.0.1:7010"}]


@pytest.mark.parametrize("extra, msg", [
    ({"in_sync_replicas": 3}, "in_sync_replicas=3 exceeds the group's 2 members"),
    ({"min_in_sync_replicas": 2, "in_sync_replicas": 1}, "min_in_sync_replicas must not exceed"),
    ({"peers": [{"id": "n0", "address": "127.0.0.1:7000"},
                {"id": "n1", "address": "127.0.0.1:7001"}]}, "HA addresses must be unique"),
    ({"ha_heartbeat_interval_ms": 1000, "ha_housekeeping_interval_ms": 1500}, "at least 2x"),
    ({"node_id": "n9"}, "node_id 'n9' is not among peers"),
    ({"role": "boss"}, "field 'role'"),
])
def test_master_slave_config_is_checked(extra, msg):
    base = {"mode": "master-slave", "node_id": "n0", "listen": "127.0.0.1:7000", "peers": MS_PEERS}
    with pytest.raises(config.ConfigError) as e:
        config.from_dict({**base, **extra}, "broker.yaml")
    assert msg in str(e.value)


def test_master_slave_example_config_loads():
    from pathlib import Path
    c = config.load(Path(__file__).parents[2] / "broker/examples/master-slave-n0.yaml")
    assert c.mode == "master-slave" and c.role == "master" and c.ha_replication == "sync"
    assert [c.ha_address_of(p) for p in c.peers] == ["127.0.0.1:10912", "127.0.0.1:10922", "127.0.0.1:10932"]
    assert config.BrokerConfig.ha_address_of(config.Peer(id="x", address="[::1]:9000")) == "[::1]:9001"
