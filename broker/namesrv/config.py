"""Name-server configuration: one YAML file (`tidelog namesrv start --config namesrv.yaml`),
validated on start so that a bad value is a clear error naming the field. The fields are in
README.md's name-server table and docs/design/name-server.md §2."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.config import (ConfigError, RoleEntry, TlsFiles, UserEntry, parse_hostport, read_yaml,
                           validated)

MiB = 1 << 20


class NamesrvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = "127.0.0.1:9876"  # RocketMQ's port
    namesrv_id: str = Field(default_factory=lambda: socket.gethostname()[:64] or "namesrv",
                            pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    broker_expire_ms: int = Field(120_000, ge=1000)  # RouteInfoManager.DEFAULT_BROKER_CHANNEL_EXPIRED_TIME
    scan_interval_ms: int = Field(5000, ge=10)  # NamesrvConfig.scanNotActiveBrokerInterval
    startup_grace_ms: int = Field(5000, ge=0)  # a route miss answers SYSTEM_BUSY meanwhile
    # off: the auto-creation template (%TBW102) is not routed here, so no producer asking this name
    # server auto-creates a topic (brokers decide which groups offer it: their own auto_create_topic_enable)
    auto_create_topic_enable: bool = True

    # bounds: a registration past them is refused BAD_REQUEST naming the bound
    routes_topics_max: int = Field(100_000, ge=1)
    groups_max: int = Field(256, ge=1)
    nodes_per_group_max: int = Field(9, ge=1)

    # security, as the broker's: TLS + SCRAM users; brokers register with their member certificate
    insecure: bool = False
    tls: TlsFiles | None = None
    users: tuple[UserEntry, ...] = ()
    roles: dict[str, RoleEntry] = Field(default_factory=lambda: {"admin": RoleEntry(admin=True)})

    # connection bounds (broker/limits.py, broker/connection.py), as the broker's
    connections_max: int = Field(10_000, ge=1)
    connections_per_source_max: int = Field(1_000, ge=1)
    frame_deadline_ms: int = Field(30_000, ge=100)
    auth_deadline_ms: int = Field(10_000, ge=100)
    connection_idle_timeout_ms: int = Field(120_000, ge=1000)
    connection_inflight_max: int = Field(8192, ge=1)
    connection_unsent_bytes_max: int = Field(4 * MiB, ge=64 * 1024)
    frame_bytes_max: int = Field(16 * MiB, ge=64 * 1024, le=256 * MiB)

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_file: Path | None = None
    pid_file: Path | None = None  # written (the process's pid) once it listens; removed at stop

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_hostport(v)
        return v

    def require_security(self) -> None:
        if self.tls is None and not self.insecure:
            raise ConfigError(
                "security is on by default and this name-server config has no tls (ca_file, cert_file, "
                "key_file from the cluster CA, as a broker's); to run without TLS and authentication "
                "say `insecure: true` (or --insecure)")

    @property
    def secure(self) -> bool:
        return not self.insecure and self.tls is not None

    @property
    def peers(self) -> tuple:
        """No group members here (the Guard asks): brokers prove who they are per request."""
        return ()

    @property
    def host(self) -> str:
        return parse_hostport(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_hostport(self.listen)[1]


def from_dict(data: dict, source: str = "config") -> NamesrvConfig:
    return validated(NamesrvConfig, data, source)


def load(path: Path, overrides: dict | None = None) -> NamesrvConfig:
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    return from_dict({**data, **(overrides or {})}, str(path))
