"""The name server: which broker groups exist, who leads each, which topics they hold
(docs/design/name-server.md). core.py is the pure route table, server.py its driver."""

# Auto-creation's template (RocketMQ's TBW102, TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC): a
# leading node whose broker config has auto_create_topic_enable lists this topic in its
# registration, with default_topic_queues queues (broker/registrar.py); to the name server it is
# a topic like any other (its route: the groups that create unknown topics on first send). A
# ClusterProducer that finds no route for a topic borrows this one (broker/client/namesrv_client.py).
# The % prefix is reserved (broker/topics.py): no user topic can take the name, and a send to it
# is refused, so the template never holds messages.
TEMPLATE_TOPIC = "%TBW102"
