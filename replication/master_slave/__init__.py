"""Master-slave HA after RocketMQ's HAService, with RocketMQ 5's epochs for safe promotion:
pure cores (master.py, slave.py, epochs.py, roles.py), wire (wire.py), and the asyncio
parts (ha_server.py, ha_client.py, peers.py) run by driver.py inside the broker."""
