"""Providers give a cluster its hosts: `local`, `netns`, `docker`, `static`.

Each one brings hosts up and down, says how to reach them (a `Host` each: run, put, get),
and knows how to cut the network for drills on its kind of host (`Faults`).
"""

from __future__ import annotations

from infra.providers.base import Faults, Provider, ProviderError
from infra.spec import ClusterSpec


def get(spec: ClusterSpec) -> Provider:
    if spec.provider == "local":
        from infra.providers.local import LocalProvider as cls
    elif spec.provider == "netns":
        from infra.providers.netns import NetnsProvider as cls
    elif spec.provider == "docker":
        from infra.providers.docker import DockerProvider as cls
    else:
        from infra.providers.static import StaticProvider as cls
    return cls(spec)


__all__ = ["Faults", "Provider", "ProviderError", "get"]
