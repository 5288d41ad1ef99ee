"""Replication modes: master-slave HA (replication/master_slave) and Raft quorum commit
(replication/raft). Each runs in the broker as a driver with the same few entry points
(start/stop, check, append, on_flushed, status); see broker/server.py."""
