"""A Spark standalone cluster on loopback from pyspark's own jars (`tidelog spark up|down|status`):
one master and two workers, each a JVM of its own started detached, so that `tidelog reconcile
--master spark://...` and the nightly DAG run the job on executors rather than in local mode.

    DIR/spark.json             the master URL, ports, and every process started: pid, start time, log
    DIR/master.log             a process's console (log4j) output; worker-1.log, worker-2.log
    DIR/work/worker-N/         a worker's work directory (each application's executor logs)
    DIR/conf/                  SPARK_CONF_DIR for the daemons: empty, so no user config leaks in
    AUTH_FILE                  the operator's Spark secret (~/.tidelog/spark-auth.conf, 0600)

RPC is authenticated (spark.authenticate): a standalone cluster has no per-application secret
(Spark makes one only in local mode and on YARN), so the master, the workers and every driver
of this user share one, generated into AUTH_FILE the first time. The daemons and the drivers
read it from that file (`--properties-file`) or get it over py4j, never on a command line
(/proc/PID/cmdline is every local user's to read); a worker hands it to its executors in their
environment (Spark's own _SPARK_AUTH_SECRET), which only this user can read. A driver of
another cluster's master needs that cluster's secret in AUTH_FILE (or $TIDELOG_SPARK_AUTH_FILE).

A process is ours when its pid's start time (/proc/PID/stat) is the one recorded at spawn: a
reused pid is never signalled. Each is started in a session of its own, so the executors and
Python workers a worker spawned are found by their session id when it is stopped; when the
recorded leader is already gone, that id may be another session's, and only its members whose
cwd is under DIR or whose SPARK_CONF_DIR is DIR/conf are taken for leftovers.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ops.localbroker import free_ports, pid_alive, port_free

DEFAULT_DIR = Path(os.environ.get("TIDELOG_SPARK_DIR", "~/.tidelog/spark")).expanduser()
AUTH_FILE = Path(os.environ.get("TIDELOG_SPARK_AUTH_FILE", "~/.tidelog/spark-auth.conf")).expanduser()
AUTH_SECRET_BYTES = 32
LOCAL_MASTER = re.compile(r"local(\[[^\]]*\])?")  # local, local[N], local[*], local[N,F]: one JVM
STATE_FILE = "spark.json"
HOST = "127.0.0.1"
MASTER_PORT = 7077               # Spark's defaults, taken when free
WEBUI_PORT = 8080
WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "1g"
READY_TIMEOUT_S = 90.0           # up: every worker ALIVE in the master's view by then
STOP_TIMEOUT_S = 15.0            # down: SIGTERM, then SIGKILL after this
KILL_WAIT_S = 5.0                # after SIGKILL: the kernel still tears the process down
REAP_WAIT_S = 5.0                # an exited process is listed (ps, pgrep) until its parent collects it
POLL_S = 0.25
LOG_TAIL_LINES = 25
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(RuntimeError):
    pass


def is_local(master: str | None) -> bool:
    """Spark in this one JVM (None: the local[2] default)? local-cluster[...] is not."""
    return master is None or LOCAL_MASTER.fullmatch(master) is not None


def auth_file() -> Path:
    """The operator's Spark secret as a properties file (spark.authenticate and its secret;
    0600), made the first time (by a link, so two first runs agree on one secret)."""
    if not AUTH_FILE.exists():
        AUTH_FILE.parent.mkdir(parents=True, exist_ok=True)
        tmp = AUTH_FILE.with_name(f".{AUTH_FILE.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w") as f:
            f.write("# written by tidelog: the Spark RPC secret of this user's standalone clusters and drivers\n"
                    f"spark.authenticate true\nspark.authenticate.secret {secrets.token_urlsafe(AUTH_SECRET_BYTES)}\n")
        try:
            os.link(tmp, AUTH_FILE)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    st = AUTH_FILE.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SparkClusterError(f"{AUTH_FILE} (the Spark RPC secret) must be this user's and 0600: "
                                f"chmod 600 it, or remove it to make a new one")
    return AUTH_FILE


def auth_conf(master: str | None) -> dict[str, str]:
    """A driver's settings for `master`: none in local mode, else spark.authenticate and the
    secret -- for py4j or a file only, never a command line."""
    if is_local(master):
        return {}
    out = {}
    for line in auth_file().read_text().splitlines():
        k, _, v = line.strip().partition(" ")
        if k.startswith("spark.authenticate"):
            out[k] = v.strip()
    return out


def auth_submit_args(master: str | None) -> list[str]:
    """spark-submit's arguments giving a driver of `master` the secret (none in local mode):
    the properties file, and spark-defaults.conf as well (which a properties file replaces)."""
    return [] if is_local(master) else ["--properties-file", str(auth_file()), "--load-spark-defaults"]


def spark_home() -> Path:
    """pyspark's package directory: its bin/spark-class and jars/ are a whole Spark."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkClusterError(f"pyspark is not installed for {sys.executable}")
    return Path(spec.origin).parent


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    s = _stat(pid)
    return int(s[19]) if s else None  # field 22 of stat: start time in clock ticks since boot


def ours(proc: dict) -> bool:
    """The recorded process still runs (the same process, not a reused pid; a zombie is gone)."""
    return pid_alive(proc["pid"]) and start_time(proc["pid"]) == proc["start_time"]


def exited(proc: dict) -> bool:
    """No thread of the recorded process runs any more. A JVM's main thread ends first: from
    then on /proc/PID/stat says Z (pid_alive: gone) while its other threads still exit, holding
    ports and memory; only when every thread is a zombie has the process exited."""
    pid = proc["pid"]
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    if start_time(pid) != proc["start_time"]:
        return True  # gone, and the pid another process's now
    return all((_task_state(pid, t) or "Z") in "ZX" for t in tids)


def _task_state(pid: int, tid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def collected(proc: dict) -> bool:
    """The recorded process is gone from the process table: its parent took its exit status
    (PID 1 for a detached process, which may take a second or two; ps and pgrep list it until
    then). Our own child (a failed `up`) is collected here."""
    try:
        os.waitpid(proc["pid"], os.WNOHANG)
    except ChildProcessError:
        pass
    return start_time(proc["pid"]) != proc["start_time"]


def wait_for(procs: list[dict], done, timeout_s: float) -> bool:
    """Until done(p) for every process, at most timeout_s; whether they all got there."""
    deadline = time.monotonic() + timeout_s
    while not all(done(p) for p in procs):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def wait_gone(procs: list[dict]) -> None:
    """Until each process has exited (at most KILL_WAIT_S) and been collected (REAP_WAIT_S: a
    zombie holds nothing, and no signal makes its parent collect it sooner)."""
    wait_for(procs, exited, KILL_WAIT_S)
    wait_for(procs, collected, REAP_WAIT_S)


def terminate(procs: list[dict], timeout_s: float) -> None:
    """SIGTERM each process ({"pid", "start_time"}), SIGKILL those that have not exited after
    timeout_s (their "killed" says which), and return once they are gone (wait_gone)."""
    for p in procs:
        _signal(p["pid"], signal.SIGTERM)
    wait_for(procs, exited, timeout_s)
    for p in procs:
        p["killed"] = not exited(p)
        if p["killed"]:
            _signal(p["pid"], signal.SIGKILL)
    wait_gone(procs)


def session_members(sid: int) -> list[int]:
    """Live processes in session `sid` (a worker's executors and their Python workers)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = _stat(int(d))
            if s and s[0] != "Z" and int(s[3]) == sid:
                out.append(int(d))
    return out


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def pick_port(wanted: int | None, default: int, what: str, spare) -> int:
    """`wanted` if given (it must be free), else Spark's default when free, else the next of
    `spare` (free ports chosen together, so none repeats)."""
    if wanted:
        if not port_free(HOST, wanted):
            raise SparkClusterError(f"{what} {HOST}:{wanted} is taken: give another, or leave it out for a free one")
        return wanted
    return default if port_free(HOST, default) else next(spare)


class SparkCluster:
    def __init__(self, directory: Path = DEFAULT_DIR):
        self.dir = Path(directory).expanduser().resolve()

    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    def state(self) -> dict | None:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None

    def running(self) -> list[dict]:
        st = self.state()
        return [p for p in (st or {}).get("processes", []) if ours(p)]

    def _env(self) -> dict:
        conf = self.dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        return {**env, "SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(conf), "SPARK_LOCAL_IP": HOST,
                "SPARK_LOG_DIR": str(self.dir), "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                # a taken port is an error in the log, not a silent move to the next port
                "SPARK_DAEMON_JAVA_OPTS": "-Dspark.port.maxRetries=0",
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}  # its port 6066 is one more to collide

    def _spawn(self, name: str, args: list[str], env: dict) -> dict:
        log = self.dir / f"{name}.log"
        with open(log, "ab") as out:
            p = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.dir,
                                 start_new_session=True)
        return {"name": name, "pid": p.pid, "start_time": start_time(p.pid), "log": str(log)}

    def up(self, port: int | None = None, webui_port: int | None = None, workers: int = WORKERS,
           timeout_s: float = READY_TIMEOUT_S) -> dict:
        """Start the master and the workers, wait until every worker is ALIVE; status() then.
        Already running: its status (`started` False). A failure stops whatever it started."""
        if self.running():
            st = self.status()
            if not st["running"] or st["workers_alive"] < st["workers"]:
                what = st.get("reason") or f"{st['workers_alive']} of {st['workers']} workers ALIVE"
                raise SparkClusterError(f"the Spark cluster in {self.dir} is half up ({what}): "
                                        f"`tidelog spark down --data-dir {self.dir}` first")
            return {**st, "started": False}
        self.dir.mkdir(parents=True, exist_ok=True)
        spare = iter(free_ports(2 + workers, HOST))
        port = pick_port(port, MASTER_PORT, "--port", spare)
        webui_port = pick_port(webui_port, WEBUI_PORT, "--webui-port", spare)
        url = f"spark://{HOST}:{port}"
        env = self._env()
        auth = ["--properties-file", str(auth_file())]  # spark.authenticate and the secret
        st = {"master_url": url, "host": HOST, "port": port, "webui_port": webui_port, "workers": workers,
              "python": sys.executable, "python_version": sys.version.split()[0], "spark_home": env["SPARK_HOME"],
              "processes": []}
        procs = st["processes"]
        try:
            procs.append(self._spawn("master", [MASTER_CLASS, "--host", HOST, "--port", str(port),
                                                "--webui-port", str(webui_port), *auth], env))
            self._write(st)
            for i in range(1, workers + 1):
                work = self.dir / "work" / f"worker-{i}"
                work.mkdir(parents=True, exist_ok=True)
                procs.append(self._spawn(f"worker-{i}", [
                    WORKER_CLASS, url, "--host", HOST, "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                    "--webui-port", str(next(spare)), "--work-dir", str(work), *auth], env))
                self._write(st)
            self._wait_ready(st, timeout_s)
        except BaseException:
            self._stop(procs)
            raise
        return {**self.status(), "started": True}

    def _write(self, st: dict) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=1))
        tmp.replace(self.state_path)

    def _wait_ready(self, st: dict, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        seen = None
        while time.monotonic() < deadline:
            dead = [p for p in st["processes"] if not ours(p)]
            if dead:
                p = dead[0]
                raise SparkClusterError(f"the Spark {p['name']} (pid {p['pid']}) exited while starting; "
                                        f"the end of {p['log']}:\n{log_tail(Path(p['log']))}")
            seen = master_json(st["webui_port"])
            if seen is not None and seen.get("status") == "ALIVE" and alive_workers(seen) >= st["workers"]:
                return
            time.sleep(POLL_S)
        have = ("its web UI never answered" if seen is None
                else f"{alive_workers(seen)} of {st['workers']} workers ALIVE")
        raise SparkClusterError(f"the Spark cluster was not ready within {timeout_s:g}s ({have}); the end of "
                                f"{self.dir / 'master.log'}:\n{log_tail(self.dir / 'master.log')}")

    def status(self) -> dict:
        """What runs: the master URL, the processes alive, the workers the master sees ALIVE."""
        st = self.state()
        if st is None:
            return {"running": False, "dir": str(self.dir), "reason": f"not running (no cluster in {self.dir})"}
        alive = {p["name"]: ours(p) for p in st["processes"]}
        seen = master_json(st["webui_port"]) if alive.get("master") else None
        workers = alive_workers(seen) if seen else 0
        running = bool(alive.get("master")) and seen is not None
        left = [n for n, a in alive.items() if a]
        return {"running": running, "dir": str(self.dir), "master_url": st["master_url"],
                "webui": f"http://{HOST}:{st['webui_port']}", "workers_alive": workers, "workers": st["workers"],
                "cores": (seen or {}).get("cores", 0), "python": st["python"],
                "processes": [{**p, "alive": alive[p["name"]]} for p in st["processes"]],
                **({} if running else {"reason": "not running" + (
                    f" (its web UI does not answer, yet {', '.join(left)} still run: `tidelog spark down`)"
                    if left else "")})}

    def down(self) -> list[dict]:
        """Stop every process `up` started (by its recorded pid; idempotent); those it stopped."""
        st = self.state()
        if st is None:
            return []
        return self._stop(st["processes"])

    def _stop(self, procs: list[dict]) -> list[dict]:
        """SIGTERM the live ones (workers first), SIGKILL what remains after STOP_TIMEOUT_S,
        then whatever their sessions still hold (executors outlive a killed worker); returns
        once every one of them is gone (`terminate`, `wait_gone`)."""
        live = [p for p in reversed(procs) if ours(p)]
        terminate(live, STOP_TIMEOUT_S)
        led = {p["pid"] for p in live}  # leaders ours when this began: their sessions are ours
        left = []
        for p in procs:
            for pid in session_members(p["pid"]):
                since = start_time(pid)
                if p["pid"] in led:
                    if (p["start_time"] or 0) <= (since or -1):  # started after its leader
                        _signal(pid, signal.SIGKILL)
                        left.append({"pid": pid, "start_time": since})
                elif self._placed_here(pid):  # its leader was gone: the id may be another's session now
                    _signal(pid, signal.SIGKILL)
                    left.append({"pid": pid, "start_time": since})
        wait_gone(left)
        return live

    def _placed_here(self, pid: int) -> bool:
        """The process works in this cluster's directory or has its SPARK_CONF_DIR (what an
        executor or its Python workers inherit), so it is a leftover of this cluster."""
        try:
            if Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(self.dir):
                return True
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            return False
        return f"SPARK_CONF_DIR={self.dir / 'conf'}".encode() in env


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via $http_proxy


def master_json(webui_port: int, timeout_s: float = 2.0) -> dict | None:
    """The master web UI's /json/ (its workers and their states), None when it does not answer."""
    try:
        with _NO_PROXY.open(f"http://{HOST}:{webui_port}/json/", timeout=timeout_s) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def alive_workers(master: dict) -> int:
    return sum(1 for w in master.get("workers", []) if w.get("state") == "ALIVE")
