"""Shared fixtures. Randomized tests take `seed`; a failure prints how to replay it."""

import os
import random

import pytest


@pytest.fixture
def seed(request):
    value = int(os.environ.get("TIDELOG_SEED") or random.randrange(2**32))
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def rng(seed):
    return random.Random(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for name, value in item.user_properties:
            if name == "seed":
                rep.sections.append(("seed", f"replay with: TIDELOG_SEED={value} pytest '{item.nodeid}'"))


@pytest.fixture(scope="session")
def airflow_db(tmp_path_factory):
    """The tests' own Airflow: an AIRFLOW_HOME with a migrated metadata DB (tests/airflow_env.py);
    the environment to run Airflow children with."""
    from tests import airflow_env

    e = airflow_env.env(tmp_path_factory.mktemp("airflow"))
    airflow_env.migrate(e)
    return e


@pytest.fixture(autouse=True)
def cluster_credentials(monkeypatch):
    """A test that brings a local cluster up is its user: it exports the credentials file
    `tidelog cluster up` names (TIDELOG_CREDENTIALS), so the test's own clients authenticate
    the way the README tells users to. Clusters are secure by default."""
    from ops.cluster import LocalCluster

    up = LocalCluster.up

    def up_and_export(self, *args, **kwargs):
        out = up(self, *args, **kwargs)
        creds = self.credentials_file
        if creds is not None:
            monkeypatch.setenv("TIDELOG_CREDENTIALS", str(creds))
        return out

    monkeypatch.setattr(LocalCluster, "up", up_and_export)
