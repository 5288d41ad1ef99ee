"""Request and response codes of the Tidelog wire protocol (after RocketMQ's names)."""

from __future__ import annotations

from enum import IntEnum


class Req(IntEnum):
    AUTH = 5  # SCRAM-SHA-256 exchange (broker/security/scram.py): the first request on a secure connection
    SEND = 10
    SEND_BATCH = 11
    SEND_ZONE = 12  # a record batch as the store keeps it (TLE2's producer part); answered as SEND_BATCH
    PULL = 20
    QUERY_OFFSET = 30
    COMMIT_OFFSET = 31
    CREATE_TOPIC = 40
    LIST_TOPICS = 41
    DESCRIBE_TOPIC = 42
    GET_ROUTE = 43
    QUERY_BY_KEY = 50
    QUERY_BY_ID = 51
    HEARTBEAT = 60
    LIST_GROUPS = 61  # consumer groups with their topics, members and total lag
    DESCRIBE_GROUP = 62  # one group: offsets and lag per queue, members (tidelog group describe)
    STATUS = 70
    TRANSFER_LEADER = 71
    GET_METADATA = 72  # master-slave: a slave pulls topic configs and consumer offsets
    HA_ROLE = 73  # master-slave: promote / fence / follow (tidelog admin promote)
    ACL_UPDATE = 74  # admin: list, set or delete a user or a role at runtime (broker/protocol/acl.py)
    FAULT = 80  # drills: the transport-level fault switch (broker/faults.py)
    RAFT = 100  # oneway: a Raft message between group members (replication/raft/wire.py)
    # name server (broker/protocol/namesrv.py; RocketMQ's numbers)
    REGISTER_BROKER = 103  # broker node -> name server: who it is, its role, its topics
    UNREGISTER_BROKER = 104  # broker node -> name server, on a clean stop
    GET_TOPIC_ROUTE = 105  # client -> name server: every group's queues and leader for a topic
    GET_CLUSTER_INFO = 106  # admin -> name server: every group, node, role, term


class Code(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2  # overloaded: not stored, retry later
    REQUEST_CODE_NOT_SUPPORTED = 3
    BAD_FRAME = 4  # garbled or truncated frame: the connection is closed
    FRAME_TOO_LARGE = 5  # frame_bytes_max exceeded: the connection is closed
    UNSUPPORTED_VERSION = 6
    BAD_REQUEST = 7  # a well-framed request whose body does not decode or validate
    FLUSH_DISK_TIMEOUT = 10  # stored, but not fsynced within sync_flush_timeout_ms
    SLAVE_NOT_AVAILABLE = 11  # not stored: a SYNC master has too few replicas in sync
    FLUSH_SLAVE_TIMEOUT = 12  # stored on the master, slaves did not ack in time
    MESSAGE_TOO_LARGE = 13
    AUTH_FAILED = 15  # no, unknown or wrong credentials (or not authenticated yet): nothing done
    NO_PERMISSION = 16  # the user's roles do not allow this (topic PUB/SUB, group, admin), or the topic is not writable / readable
    TOPIC_NOT_EXIST = 17
    QUEUE_ID_INVALID = 18
    PULL_NOT_FOUND = 19  # no new message (after long polling)
    PULL_OFFSET_MOVED = 21  # the offset is out of range: the body says where to go
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_GROUP_NOT_EXIST = 26  # DESCRIBE_GROUP of a group with no offsets and no members
    DISK_FULL = 30  # not stored: no disk space
    STORE_NOT_WRITABLE = 31  # not stored: the store hit an I/O error
    TOPIC_EXISTS = 32
    NOT_LEADER = 40  # not stored: ask the leader (header "leader", when known)
    TERM_CHANGED = 41  # stored by a leader that lost leadership before a quorum held it
    WAIT_QUORUM_ACK_TIMEOUT = 42  # stored by the leader; a quorum did not ack in time
    LEADER_TRANSFERRING = 43  # not stored: leadership is moving, retry shortly
    FAULT_INJECTION_DISABLED = 50  # a FAULT request to a node without fault_injection: true
    NOT_CONNECTED = 60  # client side only, never on the wire: no broker took the connection
    NAMESRV_UNAVAILABLE = 61  # client side only, never on the wire: no name server answered


# Not stored for sure: a producer may retry (another broker, or later).
RETRIABLE = frozenset({Code.SYSTEM_BUSY, Code.DISK_FULL, Code.STORE_NOT_WRITABLE, Code.NOT_LEADER,
                       Code.LEADER_TRANSFERRING, Code.SLAVE_NOT_AVAILABLE})
# May or may not end up committed: a retry (with the same msg_id) may duplicate.
OUTCOME_UNKNOWN = frozenset({Code.TERM_CHANGED, Code.WAIT_QUORUM_ACK_TIMEOUT})
# Stored, but the durability the broker promises was not reached in time.
STORED_NOT_CONFIRMED = frozenset({Code.FLUSH_DISK_TIMEOUT, Code.FLUSH_SLAVE_TIMEOUT})
# Answers to a SEND that mean "not stored" for sure. Any other error code (SYSTEM_ERROR: the
# broker failed somewhere, maybe after storing; a code this client does not know) leaves the
# outcome unknown: a producer never reports stored=False on the strength of those.
NOT_STORED = RETRIABLE | frozenset({
    Code.REQUEST_CODE_NOT_SUPPORTED, Code.BAD_FRAME, Code.FRAME_TOO_LARGE, Code.UNSUPPORTED_VERSION,
    Code.BAD_REQUEST, Code.MESSAGE_TOO_LARGE, Code.NO_PERMISSION, Code.AUTH_FAILED, Code.TOPIC_NOT_EXIST,
    Code.QUEUE_ID_INVALID})


def name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"CODE_{code}"


class BadRequest(ValueError):
    """A request body that does not decode or validate (answered with BAD_REQUEST)."""


class FieldLimitError(ValueError):
    """A value an encoder cannot put on the wire: a length or number outside its field's
    limit (a topic over TOPIC_BYTES_MAX, a header value over 65535 bytes, a negative u64...).
    Raised before anything is sent; the message names the field and the limit."""

    def __init__(self, field: str, value, limit: str):
        self.field, self.value, self.limit = field, value, limit
        super().__init__(f"{field}: {value}, the limit is {limit}")


def check_len(field: str, data, limit: int, name: str) -> None:
    """`data` (bytes) fits a length field whose limit is `limit` (`name`: the limit's name)."""
    if len(data) > limit:
        raise FieldLimitError(field, f"{len(data)} bytes", f"{name}={limit}")


def check_int(field: str, value, lo: int, hi: int) -> None:
    if not isinstance(value, int):
        raise FieldLimitError(field, repr(value), "an integer")
    if not lo <= value <= hi:
        raise FieldLimitError(field, value, f"{lo}..{hi}")
