"""Raft quorum commit after RocketMQ DLedger: a pure core (node, progress, quorum math,
messages) fed with messages and ticks, and an asyncio driver that does the I/O."""
