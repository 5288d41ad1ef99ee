"""Issue 14: spec values reach root shell commands on the hosts (iptables over SSH, the netns
sshd line). Every builder quotes or rejects them: a hostile value is one argument or an error,
never a second command. The iptables lines are run for real through bash against a fake
`iptables` that records its arguments, so an injection would show as a file it creates."""

import os
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.hosts import LocalHost
from infra.providers.base import SSHFaults
from infra.providers.netns import NetnsProvider


def shell_words(command: str) -> list[str]:
    """Words as the shell sees them: quotes respected, ; | & < > ( ) split off as operators."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = ""
    return list(lex)


@pytest.fixture
def fake_iptables(tmp_path, monkeypatch):
    """An `iptables` first on PATH that logs each call's arguments as [a][b]... lines."""
    bindir, log = tmp_path / "bin", tmp_path / "iptables.log"
    bindir.mkdir()
    script = bindir / "iptables"
    script.write_text(f'#!/bin/bash\nfor a in "$@"; do printf "[%s]" "$a"; done >> {shlex.quote(str(log))}\n'
                      f'echo >> {shlex.quote(str(log))}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return log


def faults(ssh_port=None):
    spec = SimpleNamespace(host=lambda name: SimpleNamespace(ssh_port=ssh_port), ssh=SimpleNamespace(port=22))
    return SSHFaults(SimpleNamespace(spec=spec, host=lambda name: LocalHost(name, "127.0.0.1")))


def hostile(marker: Path) -> str:
    return f"10.0.0.1;touch${{IFS}}{marker};#"   # the address, aimed at a file we can see


def test_partition_with_a_hostile_address_runs_no_second_command(tmp_path, fake_iptables):
    marker = tmp_path / "pwned"
    node = SimpleNamespace(host="h1", ip="10.0.0.2", id="h1")
    other = SimpleNamespace(host="h2", ip=hostile(marker), id="h2")
    f = faults()
    try:
        f.partition(node, [other])
    except ValueError as e:   # rejected before anything runs: fine too
        assert "IP address" in str(e)
    assert not marker.exists(), "the address was run as a shell command"
    if fake_iptables.exists():
        assert f"[-s][{other.ip}][-j][DROP]" in fake_iptables.read_text()


@pytest.mark.parametrize("value", ["10.0.0.1;touch${IFS}MARK;#", "$(touch MARK)", "`touch MARK`",
                                   "x|touch MARK", "x&&touch MARK", "x\ntouch MARK", "x'; touch MARK; '",
                                   'x" ; touch MARK ; "', "x > MARK", "-j ACCEPT"])
def test_iptables_rule_arguments_stay_one_argument(tmp_path, fake_iptables, value):
    marker = tmp_path / "pwned"
    value = value.replace("MARK", str(marker))
    f = faults()
    line = f.commands([["-s", value, "-j", "DROP"]])
    words = shell_words(line)
    assert value in words                                 # one word, as written
    LocalHost("h1", "127.0.0.1").run(line)
    assert not marker.exists()
    assert f"[-w][-A][TIDELOG][-s][{value}][-j][DROP]\n" in fake_iptables.read_text()


def test_isolate_takes_the_ssh_port_as_a_number_and_heal_flushes(tmp_path, fake_iptables):
    marker = tmp_path / "pwned"
    node = SimpleNamespace(host="h1", ip="10.0.0.2", id="h1")
    with pytest.raises(ValueError):
        faults(ssh_port=f"22;touch {marker}").isolate(node)
    assert not marker.exists()
    f = faults(ssh_port=2222)
    f.isolate(node)
    assert "[-w][-A][TIDELOG][-p][tcp][--dport][2222][-j][ACCEPT]" in fake_iptables.read_text()
    f.heal()
    assert fake_iptables.read_text().splitlines()[-1] == "[-w][-F][TIDELOG]" and not f.touched


@pytest.mark.parametrize("state", ["/tmp/a b", "/tmp/x;touch /tmp/pwned", "/tmp/$(id)", "/tmp/`id`", "/tmp/'q'"])
def test_netns_sshd_line_quotes_the_state_directory(state):
    d = Path(state) / "hosts" / "h1"
    words = shell_words(NetnsProvider.sshd_inner("h1", d))
    assert words == ["hostname", "h1", "&&", "mount", "--bind", f"{d}/srv", "/srv", "&&",
                     "exec", "/usr/sbin/sshd", "-f", f"{d}/sshd_config", "-E", f"{d}/sshd.log"]
