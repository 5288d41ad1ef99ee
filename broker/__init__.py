"""Tidelog broker: one node (store, wire protocol, server, processors, clients)."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("tidelog")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+src"
