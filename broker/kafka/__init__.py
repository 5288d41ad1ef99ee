"""The Kafka protocol over Tidelog's store: codecs (codec.py, apis.py, records.py) first."""
