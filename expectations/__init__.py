"""Great Expectations suites and checkpoints for the reconciled tables."""
