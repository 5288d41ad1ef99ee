"""Broker configuration: one YAML file, every field documented in README.md, validated on
start so that a bad value is a clear error naming the field."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from broker.store import codec
from broker.store.message_store import BATCH_GROUP_BYTES, StoreOptions
from broker.store.retention import RetentionPolicy, parse_delete_when

MiB = 1 << 20


class ConfigError(ValueError):
    """A configuration problem, worded for the operator."""


def parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port")
    return host.strip("[]"), int(port)


class Peer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    address: str  # host:port where the other members and clients reach this node
    ha_address: str | None = None  # master-slave: its HA port (default: address's port + 1)
    kafka_address: str | None = None  # its Kafka listener (default: address's port + 2)

    @field_validator("address", "ha_address", "kafka_address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None:
            parse_hostport(v)
        return v


class TlsFiles(BaseModel):
    """PEM files from the cluster CA (broker/security/ca.py; `tidelog deploy` and `cluster up`
    write them 0600 beside the node's config)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path      # the cluster CA: clients' and members' certificates must chain to it
    cert_file: Path    # this node's certificate (its member id in a URI SAN, its addresses in IP SANs)
    key_file: Path


class UserEntry(BaseModel):
    """A user who authenticates with SCRAM-SHA-256; `scram` is the salted verifier
    (broker/security/scram.py make_verifier), never the password; `scram512` the same password's
    SCRAM-SHA-512 verifier, which Kafka clients may use instead (None: SHA-256 only)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    roles: tuple[str, ...] = ()
    scram: str
    scram512: str | None = None


class RoleEntry(BaseModel):
    """What a role may do: topic patterns it may publish to / subscribe to, consumer-group
    patterns it may use, and whether it may run admin operations. A pattern is a name or a
    prefix ending in `*`; `*` alone is everything."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    admin: bool = False
    pub: tuple[str, ...] = ()
    sub: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


# what a producer's batch of batch_bytes_max (counted with 34 bytes per message) adds as a zone
ZONE_SLACK_BYTES = 64 * 1024
KAFKA_AUTO = "auto"
KAFKA_PORT_OFFSET = 2  # the Kafka listener's default port: the client port + 2 (HA has + 1)
FRAME_SLACK_BYTES = 64 * 1024  # a frame's header and the raft push's fields beside an entry


class BrokerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    broker_name: str = Field("broker-a", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    listen: str = "127.0.0.1:10911"
    # the Kafka protocol listener: host:port, "auto" (the client host, port + 2), or none (off)
    kafka_listener: str | None = KAFKA_AUTO
    data_dir: Path = Path("./data")
    mode: Literal["standalone", "raft", "master-slave"] = "standalone"

    # raft and master-slave: a group of `peers`, this node (`node_id`) among them
    node_id: str | None = None
    peers: tuple[Peer, ...] = ()

    # master-slave mode (after RocketMQ's HAService)
    role: Literal["master", "slave"] = "slave"  # at the first start; then <data_dir>/ha/role.json
    ha_replication: Literal["sync", "async"] = "sync"  # sync: a send waits for in_sync_replicas
    in_sync_replicas: int = Field(2, ge=1, le=64)  # replicas that must hold a send, master included
    min_in_sync_replicas: int = Field(1, ge=1, le=64)
    ha_auto_degrade: bool = False  # let in_sync_replicas shrink to min_in_sync_replicas
    ha_async_self_fence: bool = False  # async: take a send only while a majority holds the log
    slave_ack_timeout_ms: int = Field(3000, ge=10, le=600_000)
    ha_slave_fallbehind_max_bytes: int = Field(256 * MiB, ge=0)
    ha_transfer_batch_bytes: int = Field(1024 * 1024, ge=1024, le=16 * MiB)
    ha_socket_buffer_bytes: int | None = Field(None, ge=4096)  # kernel buffers; None: autotuned
    ha_heartbeat_interval_ms: int = Field(1000, ge=10)  # a slave quiet for 2x this is not in sync
    ha_housekeeping_interval_ms: int = Field(20_000, ge=50)
    ha_probe_interval_ms: int = Field(1000, ge=50)  # a master looks for a newer one this often
    metadata_sync_interval_ms: int = Field(10_000, ge=50)
    raft_tick_ms: int = Field(10, ge=1, le=1000)
    raft_election_timeout_ms: int = Field(300, ge=10)  # a follower campaigns after 1-2x this
    raft_heartbeat_interval_ms: int = Field(100, ge=1)
    raft_push_timeout_ms: int = Field(1000, ge=10)
    raft_max_pending_entries: int = Field(1000, ge=1)
    raft_push_batch_bytes_max: int = Field(1 * MiB, ge=1024)
    raft_peer_push_quota_bytes_per_s: int = Field(20 * MiB, ge=1024)
    raft_peer_push_throttle_point_bytes: int = Field(300 * MiB, ge=0)
    # a follower takes its steady state's pushes through replication/raft/lane.py (flush: async)
    raft_follower_lane: bool = True
    # a leader pushes what it just wrote, and reads the answers, through raft/leader_lane.py (async)
    raft_leader_lane: bool = True
    # a follower builds its ConsumeQueues / key index this often, or at once past the bytes
    raft_follower_dispatch_interval_ms: int = Field(10, ge=1, le=60_000)
    raft_follower_dispatch_lag_bytes_max: int = Field(4 * MiB, ge=0)
    raft_pre_vote: bool = True
    raft_check_quorum: bool = True
    wait_quorum_ack_timeout_ms: int = Field(3000, ge=10)
    leadership_transfer_lag_entries_max: int = Field(10_000, ge=0)
    leadership_transfer_timeout_ms: int = Field(3000, ge=10)
    preferred_leader: str | None = None

    flush: Literal["async", "sync"] = "async"
    flush_interval_ms: int = Field(500, ge=1, le=60_000)
    sync_flush_timeout_ms: int = Field(5000, ge=1, le=600_000)
    checkpoint_interval_ms: int = Field(1000, ge=10, le=600_000)

    segment_bytes: int = Field(1 << 30, ge=64 * 1024, le=1 << 40)
    # what a leader writes: 1 = an entry per message (TLE1); 2 = a record batch per run of
    # messages to one queue (TLE2, docs/design/batch-format.md). Every release reads both;
    # all members of a group must run a release that reads 2 before it is set.
    commitlog_format: Literal[1, 2] = 2
    message_body_bytes_max: int = Field(4 * MiB, ge=1, le=64 * MiB)
    frame_bytes_max: int = Field(16 * MiB, ge=64 * 1024, le=256 * MiB)
    batch_messages_max: int = Field(1024, ge=1, le=65535)
    batch_bytes_max: int = Field(4 * MiB, ge=1, le=64 * MiB)

    auto_create_topic_enable: bool = True
    default_topic_queues: int = Field(4, ge=1, le=1024)
    topic_queues_max: int = Field(1024, ge=1, le=65535)

    file_reserved_hours: float = Field(72, gt=0)
    delete_when: str = "04"
    disk_usage_ratio_clean: float = Field(0.75, gt=0, le=1)
    disk_usage_ratio_force: float = Field(0.85, gt=0, le=1)
    disk_usage_ratio_write_max: float = Field(0.95, gt=0, le=1)
    retention_check_interval_ms: int = Field(10_000, ge=100)

    pull_messages_max: int = Field(256, ge=1, le=65535)
    pull_bytes_max: int = Field(1 * MiB, ge=1024, le=64 * MiB)
    long_polling_max_ms: int = Field(30_000, ge=0, le=600_000)
    connection_idle_timeout_ms: int = Field(120_000, ge=1000)
    connection_inflight_max: int = Field(8192, ge=1)
    consumer_expire_ms: int = Field(30_000, ge=1000)

    cq_records_per_file: int = Field(300_000, ge=16)
    index_slots: int = Field(500_000, ge=16)
    index_entries_max: int = Field(2_000_000, ge=16)
    message_index_enable: bool = True

    # security (broker/security/): TLS on every port, SCRAM users, roles; `insecure: true` is the
    # explicit opt-out (no TLS, no authentication), warned about at every start
    insecure: bool = False
    tls: TlsFiles | None = None
    users: tuple[UserEntry, ...] = ()
    roles: dict[str, RoleEntry] = Field(default_factory=lambda: {"admin": RoleEntry(admin=True)})

    # bounds against abuse (broker/limits.py, broker/connection.py)
    connections_max: int = Field(10_000, ge=1)
    connections_per_source_max: int = Field(1_000, ge=1)  # per client IP address
    frame_deadline_ms: int = Field(30_000, ge=100)  # a frame must arrive whole this long after its first byte
    auth_deadline_ms: int = Field(10_000, ge=100)  # a connection must authenticate this long after it opens
    connection_unsent_bytes_max: int = Field(4 * MiB, ge=64 * 1024)  # answers not yet sent: reads pause above
    consume_queue_open_files_max: int = Field(256, ge=8)  # ConsumeQueue files kept open (LRU)

    # name servers (broker/registrar.py, docs/design/name-server.md §4): every node registers
    # with each; empty: no name server (clients bootstrap to the group directly)
    namesrv_addresses: tuple[str, ...] = ()
    cluster_name: str = Field("tidelog", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    register_interval_ms: int = Field(30_000, ge=100)  # BrokerConfig.registerNameServerPeriod
    register_timeout_ms: int = Field(6000, ge=100)

    fault_injection: bool = False  # accept FAULT requests (drills on provider local); never in production

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_file: Path | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_hostport(v)
        return v

    @field_validator("kafka_listener")
    @classmethod
    def _kafka_listener(cls, v: str | None) -> str | None:
        if v is not None and v != KAFKA_AUTO:
            parse_hostport(v)
        return v

    @field_validator("namesrv_addresses")
    @classmethod
    def _namesrv_addresses(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for a in v:
            parse_hostport(a)
        if len(set(v)) != len(v):
            raise ValueError("name server addresses must be unique")
        return v

    @field_validator("delete_when")
    @classmethod
    def _delete_when(cls, v) -> str:
        parse_delete_when(str(v))
        return str(v)

    @model_validator(mode="after")
    def _consistent(self) -> BrokerConfig:
        # one message alone: an entry (TLE1) or a batch of one (TLE2: head, zone head, record head)
        fixed = max(codec.HEADER_SIZE, codec.BATCH_HEAD_SIZE + codec.ZONE_TOPIC_AT + codec.RECORD_SIZE)
        biggest = fixed + codec.TOPIC_BYTES_MAX + codec.PROPS_BYTES_MAX + self.message_body_bytes_max
        if self.segment_bytes < biggest + codec.BLANK_SIZE_MIN:
            raise ValueError(f"segment_bytes ({self.segment_bytes}) must hold the largest entry "
                             f"({biggest + codec.BLANK_SIZE_MIN} bytes for message_body_bytes_max="
                             f"{self.message_body_bytes_max})")
        if self.frame_bytes_max < max(self.message_body_bytes_max, self.batch_bytes_max) + 64 * 1024:
            raise ValueError("frame_bytes_max must exceed message_body_bytes_max and "
                             "batch_bytes_max by at least 64 KiB (headers)")
        if self.pull_bytes_max + 64 * 1024 > self.frame_bytes_max:
            raise ValueError("pull_bytes_max + 64 KiB must fit in frame_bytes_max")
        if self.kafka_listener not in (None, KAFKA_AUTO) and self.commitlog_format != 2:
            raise ValueError("kafka_listener needs commitlog_format: 2 (a Kafka batch is stored as it "
                             "arrived, as one record batch)")
        if not self.disk_usage_ratio_clean <= self.disk_usage_ratio_force <= self.disk_usage_ratio_write_max:
            raise ValueError("need disk_usage_ratio_clean <= disk_usage_ratio_force <= "
                             "disk_usage_ratio_write_max")
        self._check_security()
        if self.mode != "standalone":
            self._check_group()
        if self.mode == "raft":
            self._check_raft()
        if self.mode == "master-slave":
            self._check_master_slave()
        return self

    def _check_security(self) -> None:
        if self.insecure:
            return
        for u in self.users:
            unknown = [r for r in u.roles if r not in self.roles]
            if unknown:
                raise ValueError(f"users: {u.name!r} has roles {unknown} that are not in roles {sorted(self.roles)}")
        names = [u.name for u in self.users]
        if len(set(names)) != len(names):
            raise ValueError("users: names must be unique")

    def require_security(self) -> None:
        """Security is on by default: a broker starts only with TLS files (deploy and `cluster
        up` write them) or with an explicit `insecure: true`."""
        if self.tls is None and not self.insecure:
            raise ConfigError(
                "security is on by default and this config has no tls (ca_file, cert_file, key_file): "
                "`tidelog deploy` and `tidelog cluster up` make a cluster CA, certificates and users "
                "for you; to run without TLS and authentication say `insecure: true` (or --set insecure=true)")

    @property
    def secure(self) -> bool:
        """TLS and authentication are on (anything but an explicit `insecure: true`)."""
        return not self.insecure and self.tls is not None

    def member_credentials(self):
        """What this node shows when it dials another member: its own certificate (the
        member identity) and the cluster CA; None when security is off."""
        if not self.secure:
            return None
        from broker.client.security import Credentials
        t = self.tls
        return Credentials(ca_file=str(t.ca_file), cert_file=str(t.cert_file), key_file=str(t.key_file),
                           source=f"member {self.node_id or self.broker_name}'s certificate")

    def _check_group(self) -> None:
        ids = [p.id for p in self.peers]
        if not self.node_id:
            raise ValueError(f"mode {self.mode} needs node_id (this node's id among peers)")
        if self.node_id not in ids:
            raise ValueError(f"node_id {self.node_id!r} is not among peers {ids}")
        if len(set(ids)) != len(ids) or len({p.address for p in self.peers}) != len(ids):
            raise ValueError("peers: ids and addresses must be unique")
        if parse_hostport(self.peer_address)[1] != self.port:
            raise ValueError(f"listen {self.listen} and this node's peer address "
                             f"{self.peer_address} must use the same port")

    def _check_raft(self) -> None:
        ids = [p.id for p in self.peers]
        if self.preferred_leader is not None and self.preferred_leader not in ids:
            raise ValueError(f"preferred_leader {self.preferred_leader!r} is not among peers {ids}")
        if self.raft_election_timeout_ms < 3 * self.raft_heartbeat_interval_ms:
            raise ValueError("raft_election_timeout_ms must be at least 3x raft_heartbeat_interval_ms")

    def _check_master_slave(self) -> None:
        if self.in_sync_replicas > len(self.peers):
            raise ValueError(f"in_sync_replicas={self.in_sync_replicas} exceeds the group's "
                             f"{len(self.peers)} members")
        if self.min_in_sync_replicas > self.in_sync_replicas:
            raise ValueError("min_in_sync_replicas must not exceed in_sync_replicas")
        ha = [self.ha_address_of(p) for p in self.peers]
        if len(set(ha)) != len(ha) or set(ha) & {p.address for p in self.peers}:
            raise ValueError("peers: HA addresses must be unique and differ from client addresses")
        if self.ha_housekeeping_interval_ms < 2 * self.ha_heartbeat_interval_ms:
            raise ValueError("ha_housekeeping_interval_ms must be at least 2x ha_heartbeat_interval_ms")

    @staticmethod
    def ha_address_of(peer: Peer) -> str:
        if peer.ha_address:
            return peer.ha_address
        host, port = parse_hostport(peer.address)
        return f"[{host}]:{port + 1}" if ":" in host else f"{host}:{port + 1}"

    @staticmethod
    def kafka_address_of(peer: Peer) -> tuple[str, int]:
        """Where a member's Kafka listener is (what Metadata names): its kafka_address, or its
        address's port + 2."""
        if peer.kafka_address:
            return parse_hostport(peer.kafka_address)
        host, port = parse_hostport(peer.address)
        return host, port + KAFKA_PORT_OFFSET

    @property
    def kafka_listen(self) -> tuple[str, int] | None:
        """(host, port) of this broker's Kafka listener, None when it is off ("auto" is on
        with commitlog_format 2 only: Kafka batches are stored as record batches)."""
        if self.kafka_listener is None or (self.kafka_listener == KAFKA_AUTO and self.commitlog_format != 2):
            return None
        if self.kafka_listener == KAFKA_AUTO:
            return self.host, self.port + KAFKA_PORT_OFFSET
        return parse_hostport(self.kafka_listener)

    # --- derived -----------------------------------------------------------------------

    @property
    def zone_bytes_max(self) -> int:
        """The largest record batch zone (a SEND_ZONE, or a run the store groups) a leader
        writes: a run of BATCH_GROUP_BYTES plus the producer's per-message overhead, or one
        message of any allowed size; never more than a segment holds. Replicas' bounds on an
        entry's size (the slave's stream) follow from it."""
        head = codec.ZONE_TOPIC_AT + codec.TOPIC_BYTES_MAX
        one = head + codec.RECORD_SIZE + codec.PROPS_BYTES_MAX + self.message_body_bytes_max
        full = head + self.batch_bytes_max + self.batch_messages_max * codec.RECORD_SIZE  # SEND_BATCH's
        room = self.segment_bytes - codec.BATCH_HEAD_SIZE - codec.BLANK_SIZE_MIN
        # an entry travels whole in a raft push, a slave's stream and a pull or query answer
        frame = self.frame_bytes_max - FRAME_SLACK_BYTES
        return min(room, frame, max(one, full, self.batch_group_bytes + ZONE_SLACK_BYTES))

    @property
    def batch_group_bytes(self) -> int:
        """The store's cut for runs of sends it makes one record batch: BATCH_GROUP_BYTES, less
        when frames are smaller."""
        return min(BATCH_GROUP_BYTES, self.frame_bytes_max - FRAME_SLACK_BYTES - ZONE_SLACK_BYTES)

    @property
    def peer_address(self) -> str:
        return next((p.address for p in self.peers if p.id == self.node_id), self.listen)

    def ticks(self, ms: int) -> int:
        return max(1, round(ms / self.raft_tick_ms))

    @property
    def host(self) -> str:
        return parse_hostport(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_hostport(self.listen)[1]

    def store_options(self) -> StoreOptions:
        return StoreOptions(
            segment_bytes=self.segment_bytes, flush=self.flush,
            flush_interval_ms=self.flush_interval_ms, cq_records_per_file=self.cq_records_per_file,
            index_slots=self.index_slots, index_entries_max=self.index_entries_max,
            message_index_enable=self.message_index_enable, replicated=self.mode != "standalone",
            consume_queue_open_files_max=self.consume_queue_open_files_max,
            commitlog_format=self.commitlog_format, batch_group_bytes=self.batch_group_bytes)

    def retention_policy(self) -> RetentionPolicy:
        return RetentionPolicy(self.file_reserved_hours, parse_delete_when(self.delete_when),
                               self.disk_usage_ratio_clean, self.disk_usage_ratio_force)


def describe_errors(err: ValidationError, source: str, known=()) -> str:
    """A pydantic error as lines naming the field (`peers[0].id`), with a "did you mean" for
    unknown fields close to one in `known`. Shared by broker configs and cluster specs."""
    lines = []
    for e in err.errors():
        loc = ""
        for part in e["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        if e["type"] == "extra_forbidden":
            near = difflib.get_close_matches(loc, list(known), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            lines.append(f"{source}: unknown field '{loc}'{hint}")
        elif loc:
            lines.append(f"{source}: field '{loc}': {e['msg']} (got {e.get('input')!r})")
        else:
            lines.append(f"{source}: {e['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def validated(model, data: dict, source: str):
    """`model(**data)`, or a ConfigError naming each bad field (the broker's and the name
    server's configs)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return model(**data)
    except ValidationError as e:
        raise ConfigError(describe_errors(e, source, model.model_fields)) from None


def read_yaml(path: Path):
    """A config file's YAML (None when empty), or a ConfigError saying why it cannot be read."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None


def from_dict(data: dict, source: str = "config") -> BrokerConfig:
    return validated(BrokerConfig, data, source)


def load(path: Path, overrides: dict | None = None) -> BrokerConfig:
    path = Path(path)
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    if "data_dir" in data and not Path(data["data_dir"]).is_absolute():
        data["data_dir"] = str((path.parent / data["data_dir"]).resolve())
    return from_dict({**data, **(overrides or {})}, str(path))
