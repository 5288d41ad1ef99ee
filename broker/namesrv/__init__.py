"""The name server: which broker groups exist, who leads each, which topics they hold
(docs/design/name-server.md). core.py is the pure route table, server.py its driver."""
