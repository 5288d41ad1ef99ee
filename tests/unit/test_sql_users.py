"""The query server's login rules, in its own Java class (spark_jobs/java/tidelog/sql/Users.java)
without a server: driven by tests/unit/java/tidelog/sql/UsersProbe.java in a JVM of a second
(no failure delay, the probe's clock). Parallel wrong guesses get 5 checks, no more; made-up
names and other names cannot push a counting name out; a name is a SQL admin only when every
entry of it is one (admin from the entry's flag, never a role's name); the warehouse admin (a
service entry) is never locked; a user the file loses is refused at its next login."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from broker.security.scram import make_verifier

PROBE = Path(__file__).resolve().parent / "java" / "tidelog" / "sql" / "UsersProbe.java"

pytestmark = pytest.mark.skipif(shutil.which("javac") is None, reason="javac (a JDK 17) is not on PATH")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """run(scenario, *args) -> the probe's lines, split."""
    from spark_jobs import sqlsecurity, sqlserver

    jars = sqlserver.spark_home() / "jars"
    out = tmp_path_factory.mktemp("java")
    classes = sqlsecurity.compile_java(out / "server", jars)
    p = subprocess.run(["javac", "--release", "17", "-nowarn", "-cp", f"{classes}{os.pathsep}{jars}/*",
                        "-d", str(out / "probe"), str(PROBE)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    cp = os.pathsep.join([str(out / "probe"), str(classes), f"{jars}/*"])
    log4j = sqlsecurity.JAVA_SOURCES.parent / "log4j2-sqlserver.properties"  # the server's lines, on stderr

    def run(*args):
        p = subprocess.run(["java", f"-Dlog4j2.configurationFile={log4j}", "-cp", cp, "tidelog.sql.UsersProbe",
                            *map(str, args)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        return [ln.split() for ln in p.stdout.splitlines()]

    return run


def users_file(path: Path, users: dict) -> Path:
    """users.yaml as sqlsecurity.write_users writes it: {name: [(password, admin, service), ...]}."""
    path.write_text(yaml.safe_dump({
        name: [{"admin": admin, "service": service, "roles": ["r"], "scram": make_verifier(pw), "from": f"cluster-{i}"}
               for i, (pw, admin, service) in enumerate(entries)]
        for name, entries in users.items()}))
    return path


def test_parallel_wrong_guesses_get_five_checks_and_lock_the_name(probe, tmp_path):
    f = users_file(tmp_path / "users.yaml", {"target": [("target-pw", False, False)]})
    assert probe("parallel", f, "target", "target-pw", 40) == [["WRONG", "5"], ["LOCKED", "35"], ["right", "LOCKED"]]


def test_other_names_cannot_push_a_counting_name_out(probe, tmp_path):
    """The counters (4 here) hold the file's names only: 200 made-up names leave the target's
    4 failures standing; a fifth name of the file, with every counter in its window, is refused
    (fail closed) rather than evicting one; once the windows are over, it logs in."""
    f = users_file(tmp_path / "users.yaml", {"target": [("target-pw", False, False)],
                                             **{f"k{i}": [("k-pw", False, False)] for i in range(1, 5)}})
    assert dict(probe("cycle", f)) == {
        "target-1": "WRONG", "target-2": "WRONG", "target-3": "WRONG", "target-4": "WRONG",
        "k1": "WRONG", "k2": "WRONG", "k3": "WRONG", "k4": "LOCKED",
        "target-5": "WRONG", "target-right": "LOCKED", "later-k4": "OK", "later-target": "OK"}


def test_a_name_is_an_admin_only_when_every_entry_of_it_is(probe, tmp_path):
    f = users_file(tmp_path / "users.yaml", {
        "mixed": [("a-pw", True, False), ("b-pw", False, False)],    # an admin in one cluster only
        "admins": [("a-pw", True, False), ("b-pw", True, False)],
        "plain": [("p-pw", False, False)],
        "svc": [("s-pw", True, True)]})
    # the entries' roles are all named "r": admin comes from the entry's flag alone
    assert dict(probe("admin", f)) == {"admins": "true", "mixed": "false", "plain": "false", "svc": "true",
                                       "nobody": "false"}


def test_the_service_entry_is_never_locked(probe, tmp_path):
    f = users_file(tmp_path / "users.yaml", {"warehouse-admin": [("s" * 43, True, True)]})
    assert probe("service", f, "warehouse-admin", "s" * 43) == [["guesses", "WRONG"], ["right", "OK"]]


def test_a_user_the_file_loses_is_refused_at_its_next_login(probe, tmp_path):
    f = users_file(tmp_path / "users.yaml", {"gone": [("gone-pw", False, False)], "stays": [("x-pw", False, False)]})
    nxt = users_file(tmp_path / "next.yaml", {"stays": [("x-pw", False, False)]})
    assert probe("reload", f, nxt, "gone", "gone-pw") == [["before", "OK", "true"], ["after", "UNKNOWN", "false"]]
