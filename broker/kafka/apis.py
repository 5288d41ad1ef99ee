"""The Kafka APIs Tidelog speaks, declared as data for broker/kafka/codec.py, and the headers.

Field names, types and version ranges follow apache/kafka's
clients/src/main/resources/common/message/<Name>{Request,Response}.json (apache/kafka@1eb7644),
in snake_case; each message is declared only over the versions Tidelog answers (API below),
chosen so that librdkafka 2.16, kafka-python 3 and aiokafka 0.14 negotiate one they have, and
none that needs topic ids (Fetch v13+, Metadata's topic ids stay the zero UUID) or the
KIP-848 consumer protocol. ApiVersions answers with exactly this table.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from broker.kafka.codec import F, KafkaDecodeError, Message, Reader, message, uvarint

API_VERSIONS_REQUEST = message('ApiVersionsRequest', "0-3", '3+',
    F('client_software_name', 'string', '3+'),
    F('client_software_version', 'string', '3+'),
)

API_VERSIONS_RESPONSE = message('ApiVersionsResponse', "0-3", '3+',
    F('error_code', 'int16'),
    F('api_keys', (
        F('api_key', 'int16'),
        F('min_version', 'int16'),
        F('max_version', 'int16'),
    )),
    F('throttle_time_ms', 'int32', '1+'),
    F('supported_features', (
        F('name', 'string', '3+'),
        F('min_version', 'int16', '3+'),
        F('max_version', 'int16', '3+'),
    ), '3+', tag=0),
    F('finalized_features_epoch', 'int64', '3+', tag=1, default=-1),
    F('finalized_features', (
        F('name', 'string', '3+'),
        F('max_version_level', 'int16', '3+'),
        F('min_version_level', 'int16', '3+'),
    ), '3+', tag=2),
    F('zk_migration_ready', 'bool', '3+', tag=3, default=False),
)

METADATA_REQUEST = message('MetadataRequest', "1-12", '9+',
    F('topics', (
        F('topic_id', 'uuid', '10+'),
        F('name', 'string', null=True),
    ), null=True),
    F('allow_auto_topic_creation', 'bool', '4+', default=True),
    F('include_cluster_authorized_operations', 'bool', '8-10'),
    F('include_topic_authorized_operations', 'bool', '8+'),
)

METADATA_RESPONSE = message('MetadataResponse', "1-12", '9+',
    F('throttle_time_ms', 'int32', '3+'),
    F('brokers', (
        F('node_id', 'int32'),
        F('host', 'string'),
        F('port', 'int32'),
        F('rack', 'string', null=True),
    )),
    F('cluster_id', 'string', '2+', null=True),
    F('controller_id', 'int32', default=-1),
    F('topics', (
        F('error_code', 'int16'),
        F('name', 'string', null=True),
        F('topic_id', 'uuid', '10+'),
        F('is_internal', 'bool', default=False),
        F('partitions', (
            F('error_code', 'int16'),
            F('partition_index', 'int32'),
            F('leader_id', 'int32'),
            F('leader_epoch', 'int32', '7+', default=-1),
            F('replica_nodes', '[int32]'),
            F('isr_nodes', '[int32]'),
            F('offline_replicas', '[int32]', '5+'),
        )),
        F('topic_authorized_operations', 'int32', '8+', default=-2147483648),
    )),
    F('cluster_authorized_operations', 'int32', '8-10', default=-2147483648),
)

PRODUCE_REQUEST = message('ProduceRequest', "3-9", '9+',
    F('transactional_id', 'string', null=True),
    F('acks', 'int16'),
    F('timeout_ms', 'int32'),
    F('topic_data', (
        F('name', 'string'),
        F('partition_data', (
            F('index', 'int32'),
            F('records', 'records', null=True),
        )),
    )),
)

PRODUCE_RESPONSE = message('ProduceResponse', "3-9", '9+',
    F('responses', (
        F('name', 'string'),
        F('partition_responses', (
            F('index', 'int32'),
            F('error_code', 'int16'),
            F('base_offset', 'int64'),
            F('log_append_time_ms', 'int64', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('record_errors', (
                F('batch_index', 'int32', '8+'),
                F('batch_index_error_message', 'string', '8+', null=True),
            ), '8+'),
            F('error_message', 'string', '8+', null=True),
        )),
    )),
    F('throttle_time_ms', 'int32'),
)

FETCH_REQUEST = message('FetchRequest', "4-12", '12+',
    F('cluster_id', 'string', '12+', null=True, tag=0),
    F('replica_id', 'int32', default=-1),
    F('max_wait_ms', 'int32'),
    F('min_bytes', 'int32'),
    F('max_bytes', 'int32', default=2147483647),
    F('isolation_level', 'int8'),
    F('session_id', 'int32', '7+'),
    F('session_epoch', 'int32', '7+', default=-1),
    F('topics', (
        F('topic', 'string'),
        F('partitions', (
            F('partition', 'int32'),
            F('current_leader_epoch', 'int32', '9+', default=-1),
            F('fetch_offset', 'int64'),
            F('last_fetched_epoch', 'int32', '12+', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('partition_max_bytes', 'int32'),
        )),
    )),
    F('forgotten_topics_data', (
        F('topic', 'string', '7+'),
        F('partitions', '[int32]', '7+'),
    ), '7+'),
    F('rack_id', 'string', '11+', default=''),
)

FETCH_RESPONSE = message('FetchResponse', "4-12", '12+',
    F('throttle_time_ms', 'int32'),
    F('error_code', 'int16', '7+'),
    F('session_id', 'int32', '7+'),
    F('responses', (
        F('topic', 'string'),
        F('partitions', (
            F('partition_index', 'int32'),
            F('error_code', 'int16'),
            F('high_watermark', 'int64'),
            F('last_stable_offset', 'int64', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('diverging_epoch', (
                F('epoch', 'int32', '12+', default=-1),
                F('end_offset', 'int64', '12+', default=-1),
            ), '12+', tag=0, struct_=True),
            F('current_leader', (
                F('leader_id', 'int32', '12+', default=-1),
                F('leader_epoch', 'int32', '12+', default=-1),
            ), '12+', tag=1, struct_=True),
            F('snapshot_id', (
                F('end_offset', 'int64', default=-1),
                F('epoch', 'int32', default=-1),
            ), '12+', tag=2, struct_=True),
            F('aborted_transactions', (
                F('producer_id', 'int64'),
                F('first_offset', 'int64'),
            ), null=True),
            F('preferred_read_replica', 'int32', '11+', default=-1),
            F('records', 'records', null=True),
        )),
    )),
)

LIST_OFFSETS_REQUEST = message('ListOffsetsRequest', "1-7", '6+',
    F('replica_id', 'int32'),
    F('isolation_level', 'int8', '2+'),
    F('topics', (
        F('name', 'string'),
        F('partitions', (
            F('partition_index', 'int32'),
            F('current_leader_epoch', 'int32', '4+', default=-1),
            F('timestamp', 'int64'),
        )),
    )),
)

LIST_OFFSETS_RESPONSE = message('ListOffsetsResponse', "1-7", '6+',
    F('throttle_time_ms', 'int32', '2+'),
    F('topics', (
        F('name', 'string'),
        F('partitions', (
            F('partition_index', 'int32'),
            F('error_code', 'int16'),
            F('timestamp', 'int64', default=-1),
            F('offset', 'int64', default=-1),
            F('leader_epoch', 'int32', '4+', default=-1),
        )),
    )),
)

FIND_COORDINATOR_REQUEST = message('FindCoordinatorRequest', "0-3", '3+',
    F('key', 'string'),
    F('key_type', 'int8', '1+'),
)

FIND_COORDINATOR_RESPONSE = message('FindCoordinatorResponse', "0-3", '3+',
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16'),
    F('error_message', 'string', '1+', null=True),
    F('node_id', 'int32'),
    F('host', 'string'),
    F('port', 'int32'),
)

JOIN_GROUP_REQUEST = message('JoinGroupRequest', "0-7", '6+',
    F('group_id', 'string'),
    F('session_timeout_ms', 'int32'),
    F('rebalance_timeout_ms', 'int32', '1+', default=-1),
    F('member_id', 'string'),
    F('group_instance_id', 'string', '5+', null=True),
    F('protocol_type', 'string'),
    F('protocols', (
        F('name', 'string'),
        F('metadata', 'bytes'),
    )),
)

JOIN_GROUP_RESPONSE = message('JoinGroupResponse', "0-7", '6+',
    F('throttle_time_ms', 'int32', '2+'),
    F('error_code', 'int16'),
    F('generation_id', 'int32', default=-1),
    F('protocol_type', 'string', '7+', null=True),
    F('protocol_name', 'string', null=True),
    F('leader', 'string'),
    F('member_id', 'string'),
    F('members', (
        F('member_id', 'string'),
        F('group_instance_id', 'string', '5+', null=True),
        F('metadata', 'bytes'),
    )),
)

SYNC_GROUP_REQUEST = message('SyncGroupRequest', "0-5", '4+',
    F('group_id', 'string'),
    F('generation_id', 'int32'),
    F('member_id', 'string'),
    F('group_instance_id', 'string', '3+', null=True),
    F('protocol_type', 'string', '5+', null=True),
    F('protocol_name', 'string', '5+', null=True),
    F('assignments', (
        F('member_id', 'string'),
        F('assignment', 'bytes'),
    )),
)

SYNC_GROUP_RESPONSE = message('SyncGroupResponse', "0-5", '4+',
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16'),
    F('protocol_type', 'string', '5+', null=True),
    F('protocol_name', 'string', '5+', null=True),
    F('assignment', 'bytes'),
)

HEARTBEAT_REQUEST = message('HeartbeatRequest', "0-4", '4+',
    F('group_id', 'string'),
    F('generation_id', 'int32'),
    F('member_id', 'string'),
    F('group_instance_id', 'string', '3+', null=True),
)

HEARTBEAT_RESPONSE = message('HeartbeatResponse', "0-4", '4+',
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16'),
)

LEAVE_GROUP_REQUEST = message('LeaveGroupRequest', "0-4", '4+',
    F('group_id', 'string'),
    F('member_id', 'string', '0-2'),
    F('members', (
        F('member_id', 'string', '3+'),
        F('group_instance_id', 'string', '3+', null=True),
    ), '3+'),
)

LEAVE_GROUP_RESPONSE = message('LeaveGroupResponse', "0-4", '4+',
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16'),
    F('members', (
        F('member_id', 'string', '3+'),
        F('group_instance_id', 'string', '3+', null=True),
        F('error_code', 'int16', '3+'),
    ), '3+'),
)

OFFSET_COMMIT_REQUEST = message('OffsetCommitRequest', "2-8", '8+',
    F('group_id', 'string'),
    F('generation_id_or_member_epoch', 'int32', default=-1),
    F('member_id', 'string'),
    F('group_instance_id', 'string', '7+', null=True),
    F('retention_time_ms', 'int64', '2-4', default=-1),
    F('topics', (
        F('name', 'string'),
        F('partitions', (
            F('partition_index', 'int32'),
            F('committed_offset', 'int64'),
            F('committed_leader_epoch', 'int32', '6+', default=-1),
            F('committed_metadata', 'string', null=True),
        )),
    )),
)

OFFSET_COMMIT_RESPONSE = message('OffsetCommitResponse', "2-8", '8+',
    F('throttle_time_ms', 'int32', '3+'),
    F('topics', (
        F('name', 'string'),
        F('partitions', (
            F('partition_index', 'int32'),
            F('error_code', 'int16'),
        )),
    )),
)

OFFSET_FETCH_REQUEST = message('OffsetFetchRequest', "1-7", '6+',
    F('group_id', 'string'),
    F('topics', (
        F('name', 'string'),
        F('partition_indexes', '[int32]'),
    ), null=True),
    F('require_stable', 'bool', '7+', default=False),
)

OFFSET_FETCH_RESPONSE = message('OffsetFetchResponse', "1-7", '6+',
    F('throttle_time_ms', 'int32', '3+'),
    F('topics', (
        F('name', 'string'),
        F('partitions', (
            F('partition_index', 'int32'),
            F('committed_offset', 'int64'),
            F('committed_leader_epoch', 'int32', '5+', default=-1),
            F('metadata', 'string', null=True),
            F('error_code', 'int16'),
        )),
    )),
    F('error_code', 'int16', '2+'),
)

DESCRIBE_GROUPS_REQUEST = message('DescribeGroupsRequest', "0-5", '5+',
    F('groups', '[string]'),
    F('include_authorized_operations', 'bool', '3+'),
)

DESCRIBE_GROUPS_RESPONSE = message('DescribeGroupsResponse', "0-5", '5+',
    F('throttle_time_ms', 'int32', '1+'),
    F('groups', (
        F('error_code', 'int16'),
        F('group_id', 'string'),
        F('group_state', 'string'),
        F('protocol_type', 'string'),
        F('protocol_data', 'string'),
        F('members', (
            F('member_id', 'string'),
            F('group_instance_id', 'string', '4+', null=True),
            F('client_id', 'string'),
            F('client_host', 'string'),
            F('member_metadata', 'bytes'),
            F('member_assignment', 'bytes'),
        )),
        F('authorized_operations', 'int32', '3+', default=-2147483648),
    )),
)

LIST_GROUPS_REQUEST = message('ListGroupsRequest', "0-4", '3+',
    F('states_filter', '[string]', '4+'),
)

LIST_GROUPS_RESPONSE = message('ListGroupsResponse', "0-4", '3+',
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16'),
    F('groups', (
        F('group_id', 'string'),
        F('protocol_type', 'string'),
        F('group_state', 'string', '4+'),
    )),
)

CREATE_TOPICS_REQUEST = message('CreateTopicsRequest', "0-5", '5+',
    F('topics', (
        F('name', 'string'),
        F('num_partitions', 'int32'),
        F('replication_factor', 'int16'),
        F('assignments', (
            F('partition_index', 'int32'),
            F('broker_ids', '[int32]'),
        )),
        F('configs', (
            F('name', 'string'),
            F('value', 'string', null=True),
        )),
    )),
    F('timeout_ms', 'int32', default=60000),
    F('validate_only', 'bool', '1+', default=False),
)

CREATE_TOPICS_RESPONSE = message('CreateTopicsResponse', "0-5", '5+',
    F('throttle_time_ms', 'int32', '2+'),
    F('topics', (
        F('name', 'string'),
        F('error_code', 'int16'),
        F('error_message', 'string', '1+', null=True),
        F('topic_config_error_code', 'int16', '5+', tag=0),
        F('num_partitions', 'int32', '5+', default=-1),
        F('replication_factor', 'int16', '5+', default=-1),
        F('configs', (
            F('name', 'string', '5+'),
            F('value', 'string', '5+', null=True),
            F('read_only', 'bool', '5+'),
            F('config_source', 'int8', '5+', default=-1),
            F('is_sensitive', 'bool', '5+'),
        ), '5+', null=True),
    )),
)

DELETE_TOPICS_REQUEST = message('DeleteTopicsRequest', "0-5", '4+',
    F('topic_names', '[string]'),
    F('timeout_ms', 'int32'),
)

DELETE_TOPICS_RESPONSE = message('DeleteTopicsResponse', "0-5", '4+',
    F('throttle_time_ms', 'int32', '1+'),
    F('responses', (
        F('name', 'string'),
        F('error_code', 'int16'),
        F('error_message', 'string', '5+', null=True),
    )),
)

CREATE_PARTITIONS_REQUEST = message('CreatePartitionsRequest', "0-3", '2+',
    F('topics', (
        F('name', 'string'),
        F('count', 'int32'),
        F('assignments', (
            F('broker_ids', '[int32]'),
        ), null=True),
    )),
    F('timeout_ms', 'int32'),
    F('validate_only', 'bool'),
)

CREATE_PARTITIONS_RESPONSE = message('CreatePartitionsResponse', "0-3", '2+',
    F('throttle_time_ms', 'int32'),
    F('results', (
        F('name', 'string'),
        F('error_code', 'int16'),
        F('error_message', 'string', null=True),
    )),
)

DESCRIBE_CONFIGS_REQUEST = message('DescribeConfigsRequest', "0-4", '4+',
    F('resources', (
        F('resource_type', 'int8'),
        F('resource_name', 'string'),
        F('configuration_keys', '[string]', null=True),
    )),
    F('include_synonyms', 'bool', '1+', default=False),
    F('include_documentation', 'bool', '3+', default=False),
)

DESCRIBE_CONFIGS_RESPONSE = message('DescribeConfigsResponse', "0-4", '4+',
    F('throttle_time_ms', 'int32'),
    F('results', (
        F('error_code', 'int16'),
        F('error_message', 'string', null=True),
        F('resource_type', 'int8'),
        F('resource_name', 'string'),
        F('configs', (
            F('name', 'string'),
            F('value', 'string', null=True),
            F('read_only', 'bool'),
            F('is_default', 'bool', '0-0'),
            F('config_source', 'int8', '1+', default=-1),
            F('is_sensitive', 'bool'),
            F('synonyms', (
                F('name', 'string', '1+'),
                F('value', 'string', '1+', null=True),
                F('source', 'int8', '1+'),
            ), '1+'),
            F('config_type', 'int8', '3+'),
            F('documentation', 'string', '3+', null=True),
        )),
    )),
)

INIT_PRODUCER_ID_REQUEST = message('InitProducerIdRequest', "0-4", '2+',
    F('transactional_id', 'string', null=True),
    F('transaction_timeout_ms', 'int32'),
    F('producer_id', 'int64', '3+', default=-1),
    F('producer_epoch', 'int16', '3+', default=-1),
)

INIT_PRODUCER_ID_RESPONSE = message('InitProducerIdResponse', "0-4", '2+',
    F('throttle_time_ms', 'int32'),
    F('error_code', 'int16'),
    F('producer_id', 'int64', default=-1),
    F('producer_epoch', 'int16'),
)

SASL_HANDSHAKE_REQUEST = message('SaslHandshakeRequest', "0-1", 'none',
    F('mechanism', 'string'),
)

SASL_HANDSHAKE_RESPONSE = message('SaslHandshakeResponse', "0-1", 'none',
    F('error_code', 'int16'),
    F('mechanisms', '[string]'),
)

SASL_AUTHENTICATE_REQUEST = message('SaslAuthenticateRequest', "0-2", '2+',
    F('auth_bytes', 'bytes'),
)

SASL_AUTHENTICATE_RESPONSE = message('SaslAuthenticateResponse', "0-2", '2+',
    F('error_code', 'int16'),
    F('error_message', 'string', null=True),
    F('auth_bytes', 'bytes'),
    F('session_lifetime_ms', 'int64', '1+'),
)


class Api(NamedTuple):
    key: int
    request: Message
    response: Message

    @property
    def lo(self) -> int:
        return self.request.lo

    @property
    def hi(self) -> int:
        return self.request.hi


# api key -> what Tidelog answers (Kafka's ApiKeys numbers)
APIS: dict[int, Api] = {a.key: a for a in (
    Api(0, PRODUCE_REQUEST, PRODUCE_RESPONSE),
    Api(1, FETCH_REQUEST, FETCH_RESPONSE),
    Api(2, LIST_OFFSETS_REQUEST, LIST_OFFSETS_RESPONSE),
    Api(3, METADATA_REQUEST, METADATA_RESPONSE),
    Api(8, OFFSET_COMMIT_REQUEST, OFFSET_COMMIT_RESPONSE),
    Api(9, OFFSET_FETCH_REQUEST, OFFSET_FETCH_RESPONSE),
    Api(10, FIND_COORDINATOR_REQUEST, FIND_COORDINATOR_RESPONSE),
    Api(11, JOIN_GROUP_REQUEST, JOIN_GROUP_RESPONSE),
    Api(12, HEARTBEAT_REQUEST, HEARTBEAT_RESPONSE),
    Api(13, LEAVE_GROUP_REQUEST, LEAVE_GROUP_RESPONSE),
    Api(14, SYNC_GROUP_REQUEST, SYNC_GROUP_RESPONSE),
    Api(15, DESCRIBE_GROUPS_REQUEST, DESCRIBE_GROUPS_RESPONSE),
    Api(16, LIST_GROUPS_REQUEST, LIST_GROUPS_RESPONSE),
    Api(17, SASL_HANDSHAKE_REQUEST, SASL_HANDSHAKE_RESPONSE),
    Api(18, API_VERSIONS_REQUEST, API_VERSIONS_RESPONSE),
    Api(19, CREATE_TOPICS_REQUEST, CREATE_TOPICS_RESPONSE),
    Api(20, DELETE_TOPICS_REQUEST, DELETE_TOPICS_RESPONSE),
    Api(22, INIT_PRODUCER_ID_REQUEST, INIT_PRODUCER_ID_RESPONSE),
    Api(32, DESCRIBE_CONFIGS_REQUEST, DESCRIBE_CONFIGS_RESPONSE),
    Api(36, SASL_AUTHENTICATE_REQUEST, SASL_AUTHENTICATE_RESPONSE),
    Api(37, CREATE_PARTITIONS_REQUEST, CREATE_PARTITIONS_RESPONSE),
)}
API_VERSIONS = 18
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


# --- headers (RequestHeader.json v1/v2, ResponseHeader.json v0/v1) --------------------------
#
#   request:  api_key int16 | api_version int16 | correlation_id int32 | client_id string
#             (int16 length, nullable, never compact) | tagged fields (flexible requests only)
#   response: correlation_id int32 | tagged fields (flexible responses, but ApiVersions: its
#             response header is always v0, so a client that sent a version we lack can read it)

class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_at: int  # where the request body starts in the frame


def decode_request_header(buf) -> RequestHeader:
    """The header of one request frame (without the 4-byte size). KafkaDecodeError when even
    the header cannot be read (the connection is then closed: nothing can be answered)."""
    r = Reader(buf)
    key = r.fixed(_I16, "api_key")
    version = r.fixed(_I16, "api_version")
    corr = r.fixed(_I32, "correlation_id")
    n = r.fixed(_I16, "client_id")
    if n < -1:
        raise KafkaDecodeError(f"client_id: length {n}")
    client = None if n == -1 else str(r.take(n, "client_id"), "utf-8", "replace")
    api = APIS.get(key)
    if api is not None and api.request.lo <= version <= api.request.hi and api.request.flexible(version):
        tags = r.uvarint("request header tagged fields")
        for _ in range(tags):
            r.uvarint("request header tag")
            r.take(r.uvarint("request header tag size"), "request header tag")
    return RequestHeader(key, version, corr, client, r.pos)


def response_header(api_key: int, version: int, correlation_id: int) -> bytes:
    api = APIS.get(api_key)
    flexible = api_key != API_VERSIONS and api is not None and api.response.flexible(version)
    return _I32.pack(correlation_id) + (uvarint(0) if flexible else b"")
