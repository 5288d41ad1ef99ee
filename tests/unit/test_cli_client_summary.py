"""The client commands' words, from a new user's report: `tidelog produce` counts the messages
resent after an unknown outcome (possible duplicates: "0 errors" alone hid them), says "1 message"
(not "1 messages"), names the next step when no name server answers; `produce --help` and
`topic create --help` describe the command and --topic."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from functools import partial

import pytest
from click.testing import CliRunner

from broker.client import Producer
from broker.client.outcomes import SendResult
from ops.cli import client_cmds
from ops.cli.main import cli
from tests.helpers import SilentOnce


@pytest.fixture(autouse=True)
def no_progress(monkeypatch):
    monkeypatch.setenv("TIDELOG_NO_PROGRESS", "1")
    monkeypatch.setenv("TIDELOG_CREDENTIALS", "")


class Crafted:
    """A producer whose sends succeed, the ones at the `resent` positions after a resend whose
    first attempt's outcome was unknown (as Producer's results say it: possible_duplicate)."""

    def __init__(self, resent: set[int]):
        self.resent, self.n = resent, 0

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def send_async(self, topic, body, key=None, tags=None):
        i, self.n = self.n, self.n + 1
        dup = i in self.resent
        return SendResult("%032x" % i, topic, 0, i, 0, i, 0, attempts=2 if dup else 1, possible_duplicate=dup)


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_produce_counts_the_messages_resent_after_an_unknown_outcome(monkeypatch):
    monkeypatch.setattr(client_cmds, "Producer", lambda bootstrap: Crafted({3, 7}))
    r = run("produce", "-t", "orders", "-n", "10", "-w", "1")
    assert r.exit_code == 0, r.output
    assert ", 0 errors, 2 resent after an unknown outcome (possible duplicates)" in r.output, r.output
    r = run("produce", "-t", "orders", "-n", "10", "-w", "1", "--json")
    summary = json.loads(r.output)
    assert (summary["acked"], summary["errors"], summary["possible_duplicates"]) == (10, 0, 2)

    monkeypatch.setattr(client_cmds, "Producer", lambda bootstrap: Crafted(set()))
    r = run("produce", "-t", "orders", "-n", "1")
    assert r.output.startswith("sent 1 message to orders in ") and r.output.rstrip().endswith(", 0 errors"), r.output
    assert json.loads(run("produce", "-t", "orders", "-n", "1", "--json").output)["possible_duplicates"] == 0


def test_produce_through_a_real_producer_says_possible_duplicates(monkeypatch):
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(SilentOnce, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        SilentOnce.sends = 0
        monkeypatch.setattr(client_cmds, "Producer", partial(Producer, send_timeout_ms=300))
        r = run("produce", "-b", f"127.0.0.1:{port}", "-t", "t", "-n", "3", "-w", "1", "--json")
        assert r.exit_code == 0, r.output
        summary = json.loads(r.output)
        assert (summary["acked"], summary["errors"], summary["possible_duplicates"]) == (3, 0, 1)
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_no_name_server_answering_names_the_next_step():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for args in (["produce", "-t", "t", "-n", "1"], ["consume", "-t", "t", "-g", "g", "-n", "1"]):
        r = CliRunner().invoke(cli, [*args, "--namesrv", f"127.0.0.1:{port}"])
        assert r.exit_code == 1
        assert "error: no name server answered (" in r.output, r.output
        assert "give the brokers instead with -b host:port,... (or TIDELOG_BOOTSTRAP" in r.output, r.output


def test_help_describes_produce_topic_create_and_their_options():
    produce = run("produce", "--help").output
    assert "Send messages and wait for each acknowledgement." in produce
    assert "The topic to send to" in [line for line in produce.splitlines() if "--topic" in line][0]
    create = " ".join(run("topic", "create", "--help").output.split())  # help text is wrapped
    assert "Create a topic (or with --update, change its queues or permission)." in create
    assert "--force" in create and "read and write, read only, write only" in create
    assert "The topic to read" in run("consume", "--help").output


def test_plural():
    assert [client_cmds.plural(n, "topic") for n in (0, 1, 2)] == ["0 topics", "1 topic", "2 topics"]
