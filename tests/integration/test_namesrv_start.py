"""`NodeOps.start` for a name server (ops/nodes.py): the name server writes its pid file itself
once it has bound its port (namesrv.yaml's pid_file), so one whose port another process holds
is a start failure naming the cause, not a success for a process about to die."""

import socket

import pytest

from infra import providers
from ops import deploy
from ops.cluster import NAMESRV_PORT, PORT, LocalCluster, free_subnet
from ops.nodes import NodeError


def test_a_name_server_whose_port_is_taken_fails_to_start(tmp_path):
    c = LocalCluster(tmp_path / "c")
    c._write_spec(1, "standalone", "async", free_subnet(1, [PORT, NAMESRV_PORT]), {}, insecure=True, namesrv=1)
    providers.get(c.spec).up()
    o = c._namesrv_ops()[0]
    o.write_config()
    art = deploy.resolve(c.spec).name
    host, port = o.plan.address.rsplit(":", 1)
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        taken.bind((host, int(port)))
        taken.listen()
        with pytest.raises(NodeError, match="(?s)exited at start.*cannot listen on"):
            o.start(art, timeout_s=30)
        assert o.pid() is None
    finally:
        taken.close()
    pid = o.start(art, timeout_s=30)  # the port free: it starts, its own pid file names it
    try:
        assert o.pid() == pid and o.listening()
    finally:
        assert o.stop()
        o.wait_gone(pid)
