"""`tidelog broker start` / `namesrv start` with a config that has log_file (as `cluster up`
writes them) say on the terminal where they log and that they run until Ctrl-C/SIGTERM: the log
goes to the file, so a new user saw nothing at all and took the foreground process for hung."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
import yaml

from ops.localbroker import free_port, stop_pid


def start_and_stop(config: dict, what: str, tmp_path) -> list[str]:
    """Start `tidelog WHAT start --config` with `config`, wait until it listens, SIGTERM it by pid;
    its stderr lines."""
    path = tmp_path / f"{what}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = int(config["listen"].rsplit(":", 1)[1])
    p = subprocess.Popen([sys.executable, "-m", "ops.cli.main", what, "start", "--config", str(path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert p.poll() is None, p.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{what} did not listen within 30 s"
                time.sleep(0.05)
    finally:
        stop_pid(p.pid, 10)
        out, err = p.communicate(timeout=30)
    assert out == ""
    return err.splitlines()


@pytest.mark.parametrize("what", ["broker", "namesrv"])
def test_start_with_a_log_file_says_where_it_logs(tmp_path, what):
    port, log = free_port(), tmp_path / f"{what}.log"
    listen = f"127.0.0.1:{port}"
    config = {"listen": listen, "insecure": True, "log_file": str(log)}
    if what == "broker":
        config.update(data_dir=str(tmp_path / "data"), broker_name="b0")
        name = f"broker b0 on {listen}"
    else:
        config.update(namesrv_id="ns0")
        name = f"name server ns0 on {listen}"
    lines = start_and_stop(config, what, tmp_path)
    assert lines == [f"{name}: logging to {log}; runs in the foreground until Ctrl-C or SIGTERM"]
    assert log.read_text().strip()  # the log itself went to the file


def test_start_without_a_log_file_logs_on_stderr_as_before(tmp_path):
    listen = f"127.0.0.1:{free_port()}"
    lines = start_and_stop({"listen": listen, "insecure": True, "data_dir": str(tmp_path / "data"),
                            "log_level": "INFO"}, "broker", tmp_path)
    assert lines and not any("runs in the foreground" in ln for ln in lines)
