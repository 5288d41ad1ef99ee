"""Shared fixtures. Randomized tests take `seed`; a failure prints how to replay it.

Every JVM the tests start (Spark drivers in this process, in `tidelog` children and in Airflow's
tasks; the query server; a Spark standalone cluster's daemons) inherits JDK_JAVA_OPTIONS with
`-XX:TieredStopAtLevel=1`: the JIT stops at C1, so no C2 compiler thread competes with the job
(and the brokers and Airflow beside it) for the 2 cores. Most of these JVMs live for seconds on
tiny data, where C2 never pays for itself. Measured on this 2-core box (2026-11-25):
one `tidelog reconcile` (Spark, GX, catalog) 43-47 s -> 36-41 s idle, 72-78 s -> 44-54 s
under load; test_cli_reconcile_validate_sql_as_a_user 130 -> 106 s; the browser test 151 -> 134 s;
the demo test 75 -> 66 s; the reconcile DAG test 75/118 -> 64/56 s (loaded box). The one
exception: the pytest process's own long-lived Spark JVM (test_reconcile's in-process tests,
153 -> 177 s together) runs slower on C1 code; its file still breaks even. What the JVMs
compute is the same; users' JVMs keep the default JIT. Each JVM notes "Picked up
JDK_JAVA_OPTIONS" on its stderr, which Tidelog sends to the console log files.
TIDELOG_TEST_FULL_JIT=1 leaves the JIT alone.
"""

import importlib.machinery
import os
import random
import sys

import pytest

if os.environ.get("PYTEST_XDIST_WORKER") and getattr(sys.modules["__main__"], "__spec__", None) is None:
    # an xdist worker's __main__ is bare (no __spec__, no __file__, like `python -c`): PySpark's
    # Spark Connect modules, which GX imports, take that for their own doctest runner and
    # sys.exit(0) on import (pyspark/sql/connect/utils.py check_dependencies). A spec named
    # __main__ tells them otherwise and changes nothing else (multiprocessing skips that name).
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("__main__", None)

# The tests validate into their own copy of the GX project (expectations/gx without its
# uncommitted results), one per pytest process: two xdist workers validating into the repo's
# project at once rebuilt each other's Data Docs under a browser reading them, and a test run
# left its results in the user's site. Every child (tidelog, Airflow's tasks) inherits it; an
# xdist worker inherits the controller's and makes its own (GX_ROOT_OWNER names the process
# that made a copy); a TIDELOG_GX_ROOT the user set is used as it is.
GX_ROOT_OWNER = "TIDELOG_TEST_GX_ROOT_PID"
if not os.environ.get("TIDELOG_GX_ROOT") or os.environ.get(GX_ROOT_OWNER, str(os.getpid())) != str(os.getpid()):
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    _gx_root = Path(tempfile.mkdtemp(prefix="tidelog-test-gx-"))
    shutil.copytree(Path(__file__).resolve().parent.parent / "expectations" / "gx", _gx_root / "gx",
                    ignore=shutil.ignore_patterns("uncommitted"))
    os.environ["TIDELOG_GX_ROOT"] = str(_gx_root)
    os.environ[GX_ROOT_OWNER] = str(os.getpid())
    atexit.register(shutil.rmtree, _gx_root, True)

C1_ONLY = "-XX:TieredStopAtLevel=1"
if not os.environ.get("TIDELOG_TEST_FULL_JIT") and C1_ONLY not in os.environ.get("JDK_JAVA_OPTIONS", ""):
    os.environ["JDK_JAVA_OPTIONS"] = " ".join(filter(None, [os.environ.get("JDK_JAVA_OPTIONS"), C1_ONLY]))


# `make test` runs on two pytest-xdist workers with --dist loadfile: a module's tests stay on one
# worker, so its module fixtures (a Spark session) start once. These sets of modules share
# something fixed and run as one unit, one module after another: the example specs' loopback
# addresses and ports (the demo, the README tour, the CLI's "never deployed" errors, which must
# find nothing listening there); the netns test hosts and the docker daemon beside the tests'
# Airflow (one migrated metadata DB per worker: started once here).
SHARED = {
    "examples": ("tests/e2e/test_demo_and_bench.py", "tests/e2e/test_readme.py",
                 "tests/integration/test_cli_errors.py"),
    "airflow-and-hosts": ("tests/e2e/test_browser.py", "tests/integration/test_airflow_dags.py",
                          "tests/integration/test_platform_netns.py", "tests/integration/test_platform_docker.py"),
}
GROUP_OF = {path: group for group, paths in SHARED.items() for path in paths}

# The longest units first, by their measured time (seconds on a clean -n 2 run, 2026-11-28):
# xdist hands units out in order, by default the ones with the most tests first, which put
# test_reconcile (14 tests, ~600 s), one-test modules of minutes (fd exhaustion, two groups)
# and the Spark cluster last: one worker ran them for minutes after the others ran dry.
LONGEST_FIRST = (
    "airflow-and-hosts",                            # ~1,290
    "tests/integration/test_reconcile.py",          # ~600
    "tests/integration/test_platform_local.py",     # ~570
    "tests/integration/test_sql_server.py",         # ~445
    "examples",                                     # ~300
    "tests/sim/test_raft_sim.py",                   # ~275
    "tests/integration/test_fd_exhaustion.py",      # ~220 (before topics.json's fix)
    "tests/integration/test_platform_namesrv.py",   # ~210
    "tests/sim/test_ms_sim.py",                     # ~190
    "tests/integration/test_drill_combined.py",     # ~120
    "tests/integration/test_cluster_cli.py",        # ~120
    "tests/integration/test_spark_cluster.py",      # ~90
    "tests/integration/test_drill_namesrv.py",      # ~70
)
RANK = {unit: i for i, unit in enumerate(LONGEST_FIRST)}


def unit_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return GROUP_OF.get(path, path)


def pytest_collection_modifyitems(config, items):
    """LONGEST_FIRST's units first, the rest after them in collection order (a stable sort:
    a module's own order stays)."""
    items.sort(key=lambda item: RANK.get(unit_of(item.nodeid), len(RANK)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with each SHARED set as one unit. (Not xdist_group marks: xdist 3.8's
    loadgroup renames items through an attribute pytest 9 no longer reads, and splits them.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # units in collection order: LONGEST_FIRST's

    class SharedResourceScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(super()._split_scope(nodeid))

    return SharedResourceScheduling(config, log)


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
