"""Tidelog beside NATS JetStream (`make bench-peers`): the project's own copy of the shared
side-by-side harness (../shared/peers/compare.sh + bench.py), in one Python process.

    nats_cluster.py   start/stop 1 or 3 nats-server processes (JetStream, file storage) on loopback
    systems.py        the compared systems (compare.sh's SYSTEMS keys) and how each is started
    loop.py           the one client loop (W in flight, a future per message) and a run's record
    report.py         medians, the Tidelog/NATS ratios, the table (pure)
    __main__.py       python -m bench.peers: runs, JSON lines on stdout, the table on stderr
"""
