"""The slave's end of an HA link (replication/master_slave/ha_client.py MasterLink): why a
session ended decides what the slave says. A full disk is an OSError (broker/store/files.py
DiskFull), so it must be told apart before the connection failures: an error line each time
(the operator must act), not a warning every 20th connection attempt."""

from __future__ import annotations

import asyncio
import errno
import logging
from types import SimpleNamespace

import pytest

from broker.store.commitlog import StoreNotWritable
from broker.store.files import DiskFull
from replication.master_slave import ha_client


@pytest.mark.parametrize("error", [DiskFull(errno.ENOSPC, "no space left on the data disk"),
                                   StoreNotWritable("an fsync failed")])
def test_a_store_that_cannot_take_the_masters_log_is_an_error_each_time(error, monkeypatch, caplog):
    monkeypatch.setattr(ha_client, "RETRY_S", 0)
    link = ha_client.MasterLink(SimpleNamespace(), "m1", "127.0.0.1:1")
    sessions = []

    async def session():
        sessions.append(1)
        if len(sessions) > 3:
            raise asyncio.CancelledError  # ends the test's run
        raise error

    link._session = session

    async def main():
        with pytest.raises(asyncio.CancelledError):
            await link._run()

    with caplog.at_level(logging.WARNING, logger=ha_client.log.name):
        asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "cannot store what master m1 sends" in r.message]
    assert len(errors) == 3, [(r.levelname, r.message) for r in caplog.records]
    assert link.failures == 0  # not counted as connection failures
