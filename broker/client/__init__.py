"""The Tidelog Python client.

    from broker.client import Producer, Consumer
    with Producer(["127.0.0.1:10911"]) as p:
        r = p.send("orders", b"hello", key="order-1", tags="created")
    with Consumer(["127.0.0.1:10911"], group="billing", topic="orders") as c:
        for m in c.poll(timeout_ms=1000):
            ...
"""

from broker.client.admin import Admin
from broker.client.consumer import Consumer, Message
from broker.client.security import Credentials
from broker.client.errors import (AuthenticationError, BrokerError, PermissionDenied, ConnectError, ConnectionLost, CorruptMessage, NotSent,
                                  RequestTimeout, SendConnectError, SendError, TidelogError)
from broker.client.producer import Producer, SendResult
from broker.client.cluster import ClusterConsumer, ClusterProducer, NameServerUnavailable

__all__ = ["Admin", "AuthenticationError", "BrokerError", "ClusterConsumer", "ClusterProducer", "Credentials", "PermissionDenied", "ConnectError", "ConnectionLost", "Consumer", "CorruptMessage",
           "Message", "NameServerUnavailable", "NotSent", "Producer", "RequestTimeout", "SendConnectError", "SendError", "SendResult",
           "TidelogError"]
