"""Kafka's topic administration on a broker (broker/kafka/service.py's fourth part): CreateTopics,
CreatePartitions, DeleteTopics, DescribeConfigs, mapped onto the broker's own topic configs.

A topic's partitions are its queues: CreateTopics makes a topic of num_partitions queues
(-1: default_topic_queues) and CreatePartitions raises the count, both through
`repl.commit_system(topic_entry)` -- the native CREATE_TOPIC's path, replicated, answered once
kept; replication_factor is the group's and any other is refused (INVALID_REPLICATION_FACTOR);
topic configs are refused unless they only restate what Tidelog does (none are per topic
here). DeleteTopics is refused (POLICY_VIOLATION): a Tidelog topic's messages live in the
shared CommitLog until retention and its offsets in the group store; removing a topic is not
offered by the native admin either. All but DescribeConfigs need the admin role.
"""

from __future__ import annotations

from broker.kafka import errors as E
from broker.system import topic_entry
from broker.topics import TopicError

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, CREATE_PARTITIONS = 19, 20, 32, 37
SERVED = {CREATE_TOPICS: (0, 5), DELETE_TOPICS: (0, 5), DESCRIBE_CONFIGS: (0, 4), CREATE_PARTITIONS: (0, 3)}
TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_CONFIG = 36, 37, 38, 40
POLICY_VIOLATION, INVALID_REQUEST = 44, 42
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
SOURCE_DEFAULT, SOURCE_STATIC_BROKER = 5, 4


class KafkaAdmin:
    def __init__(self, broker, service):
        self.broker, self.service = broker, service
        self.handlers = {CREATE_TOPICS: self.create_topics, DELETE_TOPICS: self.delete_topics,
                         DESCRIBE_CONFIGS: self.describe_configs, CREATE_PARTITIONS: self.create_partitions}

    def _refusal(self, conn) -> tuple[int, str] | None:
        p = conn.principal
        if p is not None and not p.admin:
            return E.CLUSTER_AUTHORIZATION_FAILED, f"{p} is not an admin: topics are administered by admins"
        if not self.broker.repl.accepting_writes:
            return E.NOT_LEADER_OR_FOLLOWER, "not the node taking writes: ask the leader"  # (NOT_CONTROLLER)
        return None

    def _commit_all(self, conn, h, slot, results: list, configs: list, answer: dict) -> None:
        """Commit each (result, TopicConfig) and answer once every one is kept."""
        if not configs:
            return self.service._answer(conn, slot, h, h.api_version, answer)
        left = [len(configs)]
        conn.add_inflight(1)

        def done(result, code, error):
            if code:
                result.update(error_code=E.from_code(code), error_message=error)
            left[0] -= 1
            if left[0] == 0:
                conn.done_inflight(1)
                if not conn.closed:
                    self.service._answer(conn, slot, h, h.api_version, answer)
                    conn.flush()
        for result, cfg in configs:
            self.broker.repl.commit_system(*topic_entry(cfg), lambda code, error, r=result: done(r, code, error))

    def create_topics(self, conn, h, req, slot) -> None:
        topics = self.broker.topics
        peers = max(1, len(self.broker.config.peers))
        results, configs = [], []
        refused = self._refusal(conn)
        for t in req["topics"]:
            r = {"name": t["name"], "error_code": E.NONE, "error_message": None, "num_partitions": -1,
                 "replication_factor": -1, "configs": []}
            results.append(r)
            n = t["num_partitions"] if t["num_partitions"] != -1 else topics.default_queues
            try:
                if refused:
                    raise _Refused(*refused)
                if t["replication_factor"] not in (-1, peers):
                    raise _Refused(INVALID_REPLICATION_FACTOR, f"replication_factor {t['replication_factor']}: "
                                   f"a topic has the group's {peers} replica(s)")
                if t["assignments"]:
                    raise _Refused(INVALID_REQUEST, "manual partition assignments: partitions live on their group")
                if t["configs"]:
                    raise _Refused(INVALID_CONFIG, f"topic configs ({', '.join(c['name'] for c in t['configs'])}): "
                                   "Tidelog topics take the broker's settings")
                try:
                    cfg = topics.validate(t["name"], n, n)
                except FileExistsError:
                    raise _Refused(TOPIC_ALREADY_EXISTS, f"topic {t['name']} exists") from None
                except TopicError as e:
                    raise _Refused(E.INVALID_TOPIC_EXCEPTION if "name" in str(e) else INVALID_PARTITIONS,
                                   str(e)) from None
            except _Refused as e:
                r.update(error_code=e.code, error_message=e.message)
                continue
            r.update(num_partitions=n, replication_factor=peers)
            if not req.get("validate_only"):
                configs.append((r, cfg))
        self._commit_all(conn, h, slot, results, configs, {"throttle_time_ms": 0, "topics": results})

    def create_partitions(self, conn, h, req, slot) -> None:
        topics = self.broker.topics
        results, configs = [], []
        refused = self._refusal(conn)
        for t in req["topics"]:
            r = {"name": t["name"], "error_code": E.NONE, "error_message": None}
            results.append(r)
            cur = topics.get(t["name"])
            try:
                if refused:
                    raise _Refused(*refused)
                if cur is None:
                    raise _Refused(E.UNKNOWN_TOPIC_OR_PARTITION, f"topic {t['name']} does not exist")
                if t["count"] <= cur.write_queues:
                    raise _Refused(INVALID_PARTITIONS, f"topic {t['name']} has {cur.write_queues} partitions: "
                                   f"the count can only grow")
                try:
                    cfg = topics.validate(t["name"], t["count"], t["count"], cur.perm, update=True)
                except TopicError as e:
                    raise _Refused(INVALID_PARTITIONS, str(e)) from None
            except _Refused as e:
                r.update(error_code=e.code, error_message=e.message)
                continue
            if not req["validate_only"]:
                configs.append((r, cfg))
        self._commit_all(conn, h, slot, results, configs, {"throttle_time_ms": 0, "results": results})

    def delete_topics(self, conn, h, req, slot) -> None:
        refused = self._refusal(conn)
        code, why = refused or (POLICY_VIOLATION, "topics are not deleted in Tidelog: their messages age out "
                                "by retention (file_reserved_hours); stop writing to it instead")
        self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "responses": [
            {"name": n, "error_code": code, "error_message": why} for n in req["topic_names"]]})

    def _configs(self, kind: int, name: str) -> list[tuple[str, str]] | None:
        cfg = self.broker.config
        common = [("max.message.bytes", str(cfg.message_body_bytes_max)),
                  ("retention.ms", str(int(cfg.file_reserved_hours * 3_600_000))),
                  ("cleanup.policy", "delete"), ("compression.type", "producer"),
                  ("message.timestamp.type", "CreateTime")]
        if kind == TOPIC_RESOURCE:
            t = self.broker.topics.get(name)
            return None if t is None else common + [("tidelog.write.queues", str(t.write_queues)),
                                                     ("tidelog.read.queues", str(t.read_queues))]
        if kind == BROKER_RESOURCE:
            return common + [("tidelog.mode", cfg.mode), ("tidelog.flush", cfg.flush),
                             ("auto.create.topics.enable", str(cfg.auto_create_topic_enable).lower()),
                             ("num.partitions", str(cfg.default_topic_queues))]
        return None

    def describe_configs(self, conn, h, req, slot) -> None:
        results = []
        for res in req["resources"]:
            kind, name = res["resource_type"], res["resource_name"]
            r = {"error_code": E.NONE, "error_message": None, "resource_type": kind, "resource_name": name,
                 "configs": []}
            results.append(r)
            p = conn.principal
            if kind == TOPIC_RESOURCE and p is not None and self.service.partition_error(conn, name, 0, True) == \
                    E.TOPIC_AUTHORIZATION_FAILED:
                r.update(error_code=E.TOPIC_AUTHORIZATION_FAILED, error_message=f"{p} may not read {name}")
                continue
            pairs = self._configs(kind, name)
            if pairs is None:
                r.update(error_code=E.UNKNOWN_TOPIC_OR_PARTITION if kind == TOPIC_RESOURCE else INVALID_REQUEST,
                         error_message=f"no {'topic' if kind == TOPIC_RESOURCE else 'such resource'} {name!r}")
                continue
            keys = res["configuration_keys"]
            r["configs"] = [{"name": k, "value": v, "read_only": True, "is_default": False,
                             "config_source": SOURCE_STATIC_BROKER, "is_sensitive": False, "synonyms": [],
                             "config_type": 0, "documentation": None}
                            for k, v in pairs if keys is None or k in keys]
        self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "results": results})


class _Refused(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message
