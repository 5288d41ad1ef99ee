"""Replication modes: master-slave HA and Raft quorum commit (coming issues)."""
