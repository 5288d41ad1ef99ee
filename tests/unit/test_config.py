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
