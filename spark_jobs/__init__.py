"""Spark jobs: the nightly reconcile of replica logs."""
