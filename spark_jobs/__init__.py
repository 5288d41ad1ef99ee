"""Spark jobs: the nightly reconcile of replica logs."""

import warnings as _warnings

# pandas 3 is what the pinned stack installs; PySpark warns about it on every import, though
# nothing here goes through pandas (the job hands Arrow batches over).
_warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
