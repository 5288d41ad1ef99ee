"""SSH credentials from an Airflow `ssh` connection, read through the provider's own SSHHook
(in a child process: Airflow reads its configuration once, at import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
from infra.credentials import CredentialsError, airflow_ssh
out = {}
for conn in sys.argv[1:]:
    try:
        c = airflow_ssh(conn, "10.0.0.1", "spec-user")
        out[conn] = {"user": c.user, "key_file": str(c.key_file) if c.key_file else None,
                     "pkey": type(c.pkey).__name__ if c.pkey else None, "password": c.password}
    except CredentialsError as e:
        out[conn] = {"error": str(e)}
print("RESULT " + json.dumps(out))
"""


def test_login_keys_and_password_come_through_the_hook(tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    conns = {
        "AIRFLOW_CONN_BY_FILE": {"conn_type": "ssh", "login": "ops", "extra": {"key_file": str(key)}},
        "AIRFLOW_CONN_BY_TEXT": {"conn_type": "ssh", "login": "ops", "extra": {"private_key": key.read_text()}},
        "AIRFLOW_CONN_NO_LOGIN": {"conn_type": "ssh", "password": "s3cret"},
        "AIRFLOW_CONN_EMPTY": {"conn_type": "ssh", "login": "ops"},
    }
    (tmp_path / "probe.py").write_text(PROBE)
    env = {"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(tmp_path / "af"), "PYTHONPATH": str(Path(__file__).parents[2]),
           **{k: json.dumps(v) for k, v in conns.items()}}
    r = subprocess.run([sys.executable, str(tmp_path / "probe.py"), "by_file", "by_text", "no_login", "empty", "nope"],
                       env=env, capture_output=True, text=True, timeout=120)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(line[len("RESULT "):])
    assert got["by_file"] == {"user": "ops", "key_file": str(key), "pkey": None, "password": None}
    assert got["by_text"]["user"] == "ops" and got["by_text"]["pkey"] == "Ed25519Key"
    assert got["no_login"] == {"user": "spec-user", "key_file": None, "pkey": None, "password": "s3cret"}
    assert "holds no key or password" in got["empty"]["error"]
    assert got["nope"]["error"].startswith("Airflow connection 'nope' not found; create it (type SSH)")
