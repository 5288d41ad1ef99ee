"""Security: the cluster CA and certificates (ca.py), TLS contexts and member identity (tls.py)."""
