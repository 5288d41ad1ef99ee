"""The CommitLog store: one codec, segments, ConsumeQueues, key index, recovery."""
