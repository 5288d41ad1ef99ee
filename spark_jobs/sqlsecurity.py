"""Who may use the query server, and how they prove it (issue 39): TLS with the warehouse's own
CA, SASL PLAIN checked against SCRAM-SHA-256 verifiers, and a SQL guard that keeps users who
are not admins to reading the warehouse's tables.

A warehouse can hold the reconciled logs of several clusters, so it keeps its own secrets, in
a directory only the server's user can enter:

    <warehouse>/_catalog/security/            0700, owned by the user running the server
        ca.crt, ca.key                        the warehouse's CA (broker/security/ca.py)
        sql-server.crt, .key                  the server's certificate: IP 127.0.0.1, localhost
        server.p12                            the same as a PKCS12 keystore for the JVM (0600)
        server-conf/hive-site.xml             HiveServer2's TLS and login settings (the keystore
                                              password stays off the command line)
        users.yaml                            who may log in (0600; below)
        warehouse-admin.credentials.yaml      the warehouse admin: user, password, CA (0600)
        java/<hash>/                          the server's Java classes, compiled here from
                                              spark_jobs/java at the first start of that source
    <warehouse>/_catalog/sql-ca.crt           the CA certificate, for clients (0644)
    <warehouse>/_catalog/sql-truststore.p12   the same for JDBC (beeline's sslTrustStore)

Users (`users.yaml`, rebuilt at each `serve` and whenever this controller changes a cluster's
users; the server re-reads it when it changes):

    name: [{admin: true|false, roles: [...], scram: "SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>",
            from: FILE}]            (the warehouse admin's entry has service: true too)

- `warehouse-admin`, the warehouse's own admin: a service principal, its 256-bit generated
  password in warehouse-admin.credentials.yaml, which the operator (the user who runs the server)
  can read and nobody else can: `tidelog sql`, `ensure_catalog` and the DAG tasks use it when
  given no other credentials. Its name is its own (a cluster user of that name is not imported)
  and it is never locked out (spark_jobs/sqlserver.py says why);
- every user of every cluster this controller has state for (ops.security.cluster_security_dirs),
  as the cluster has them (ops.security.controller_acl: deploy's users and roles, overlaid with
  the runtime `tidelog user|role` changes made here), with the cluster's verifier: a cluster's
  users log in with their own passwords. A name several clusters have gets one entry per cluster.

`admin` is whether any of the user's roles has the admin flag in its cluster (never a role's
name). A SQL admin may do anything Spark SQL allows -- and a name is one only when every entry
of it is an admin (the SQL guard knows a session by its name alone: an admin of one cluster who
shares the name with a plain user of another is no SQL admin, said in the warnings). Every
other user may read the warehouse's catalog tables and run a few read-only commands (SHOW
TABLES, DESCRIBE, USE ...): spark_jobs/java/tidelog/sql/ReadOnlyGuard.java says exactly what.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple
from xml.sax.saxutils import escape

import yaml

from broker.client.security import Credentials, CredentialsError, write_credentials_file
from broker.security import ca as cas
from broker.security.scram import make_verifier, parse_verifier
from broker.store.files import write_atomic

SECURITY_DIR = "security"
ADMIN_USER = "warehouse-admin"   # reserved: no cluster user of this name is imported
ADMIN_CREDENTIALS = f"{ADMIN_USER}.credentials.yaml"
LEGACY_ADMIN_CREDENTIALS = "admin.credentials.yaml"  # before the warehouse admin had a name of its own
ADMIN_PASSWORD_BYTES = 32        # 256 bits: no guessing reaches it, so it needs no lockout
USERS_FILE = "users.yaml"
SERVER_CERT_ID = "sql-server"
SERVER_ADDRESSES = ("127.0.0.1", "localhost")
KEYSTORE = "server.p12"
PUBLIC_CA = "sql-ca.crt"
TRUSTSTORE = "sql-truststore.p12"
TRUSTSTORE_PASSWORD = "tidelog-public"  # guards nothing: the truststore holds the public CA certificate only
CERT_ROTATE_WITHIN_DAYS = 30
PASSWORD_BYTES = 18
JAVA_SOURCES = Path(__file__).resolve().with_name("java")
AUTHENTICATOR_CLASS = "tidelog.sql.ScramPasswordAuthenticator"
GUARD_CLASS = "tidelog.sql.ReadOnlyGuard"
USERS_PROPERTY = "spark.tidelog.sql.users"          # read by tidelog/sql/Users.java
WAREHOUSE_PROPERTY = "spark.tidelog.sql.warehouse"  # read by tidelog/sql/ReadOnlyGuard.java
JAVAC_TIMEOUT_S = 180.0


class SecurityError(Exception):
    """The query server's secrets cannot be made or used; the message names the file."""


class ServerFiles(NamedTuple):
    classpath: list[Path]    # the compiled classes and the server's hive-site.xml
    users_file: Path
    public_ca: Path
    truststore: Path


def catalog(warehouse: Path) -> Path:
    from spark_jobs.warehouse import catalog_dir

    return catalog_dir(warehouse)


def security_dir(warehouse: Path) -> Path:
    return catalog(warehouse) / SECURITY_DIR


def admin_credentials_file(warehouse: Path) -> Path:
    return security_dir(warehouse) / ADMIN_CREDENTIALS


def public_ca(warehouse: Path) -> Path:
    return catalog(warehouse) / PUBLIC_CA


def truststore(warehouse: Path) -> Path:
    return catalog(warehouse) / TRUSTSTORE


def _private_dir(d: Path) -> Path:
    """`d` as a directory only this user can enter (made so; an existing one is checked: the
    server puts classes from it on its class path, so nobody else may write there)."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = d.stat()
    if st.st_uid != os.geteuid():
        raise SecurityError(f"{d} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): the query server "
                            f"keeps its keys and classes there; remove it, or run the server as its owner")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(d, 0o700)
    return d


# --- users -------------------------------------------------------------------------------------

def import_users(security_dirs: list[Path], warnings: list[str] | None = None) -> dict[str, list[dict]]:
    """{name: [{admin, roles, scram, from: the cluster's security directory}]}: each cluster's
    users as ops.security.controller_acl has them. A user without a valid verifier, with a name
    the server cannot take or with the warehouse admin's is skipped (and said in `warnings`)."""
    from ops.security import controller_acl

    warnings = warnings if warnings is not None else []
    out: dict[str, list[dict]] = {}
    for d in security_dirs:
        users, roles = controller_acl(d, warnings)
        for u in sorted(users, key=lambda u: u.name):
            try:
                if not cas.NODE_ID_RE.match(u.name):
                    raise ValueError("the query server takes names of letters, digits, '_', '.', '-'")
                if u.name == ADMIN_USER:
                    raise ValueError("the name is the warehouse admin's")
                parse_verifier(u.scram)
            except ValueError as e:
                warnings.append(f"{d}: user {u.name!r} skipped: {e}")
                continue
            admin = any(roles[r].admin for r in u.roles if r in roles)
            out.setdefault(u.name, []).append({"admin": admin, "roles": list(u.roles), "scram": u.scram,
                                               "from": str(d)})
    for name, entries in sorted(out.items()):
        if len({e["admin"] for e in entries}) > 1:
            warnings.append(f"user {name!r} is an admin in {', '.join(e['from'] for e in entries if e['admin'])} "
                            f"but not in {', '.join(e['from'] for e in entries if not e['admin'])}: it is no "
                            f"SQL admin (the server tells sessions apart by name; give one of them another name)")
    return out


def ensure_admin(warehouse: Path) -> Credentials:
    """The warehouse admin's credentials (made with a new password the first time; the file
    of the name it had before, `admin`, goes: its verifier is no longer imported)."""
    path = admin_credentials_file(warehouse)
    if not path.exists():
        write_credentials_file(path, ADMIN_USER, secrets.token_urlsafe(ADMIN_PASSWORD_BYTES), public_ca(warehouse))
    (security_dir(warehouse) / LEGACY_ADMIN_CREDENTIALS).unlink(missing_ok=True)
    creds = Credentials.load(path)
    if creds.username != ADMIN_USER or not creds.password:
        raise SecurityError(f"{path}: expected username {ADMIN_USER} and a password; remove it to make a new one")
    return creds


def write_users(warehouse: Path, roots: list[Path] | None = None) -> tuple[Path, list[str]]:
    """users.yaml from the warehouse admin and every cluster's users; (its path, warnings)."""
    from ops.security import cluster_security_dirs

    warnings: list[str] = []
    users = import_users(cluster_security_dirs(roots), warnings)
    admin = ensure_admin(warehouse)
    users[ADMIN_USER] = [{"admin": True, "service": True, "roles": [], "scram": make_verifier(admin.password),
                          "from": str(admin_credentials_file(warehouse))}]
    path = security_dir(warehouse) / USERS_FILE
    write_atomic(path, yaml.safe_dump(users, sort_keys=True).encode(), 0o600)
    return path, warnings


# --- TLS ---------------------------------------------------------------------------------------

def _server_tls(warehouse: Path) -> tuple[Path, str]:
    """The CA, the server's certificate (reissued near its end), the keystore the JVM reads
    (a new password each start), the public CA and the truststore; (keystore, its password)."""
    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, pkcs12

    d = security_dir(warehouse)
    try:
        ca = cas.create_ca(d, f"sql {Path(warehouse).name}")
        crt = d / f"{SERVER_CERT_ID}.crt"
        if cas.needs_rotation(crt, CERT_ROTATE_WITHIN_DAYS, ca_file=ca.cert_file, addresses=list(SERVER_ADDRESSES)):
            cas.issue_node_cert(ca, d, SERVER_CERT_ID, list(SERVER_ADDRESSES))
        cert, key, ca_cert = cas.load_cert(crt), cas.load_key(d / f"{SERVER_CERT_ID}.key"), cas.load_cert(ca.cert_file)
    except cas.CaError as e:
        raise SecurityError(str(e)) from None
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    keystore = d / KEYSTORE
    write_atomic(keystore, pkcs12.serialize_key_and_certificates(
        b"tidelog-sql", key, cert, [ca_cert], BestAvailableEncryption(password.encode())), 0o600)
    pem = ca.cert_file.read_bytes()
    if not public_ca(warehouse).exists() or public_ca(warehouse).read_bytes() != pem \
            or not truststore(warehouse).exists():
        write_atomic(public_ca(warehouse), pem, 0o644)
        _write_truststore(public_ca(warehouse), truststore(warehouse))
    return keystore, password


def _write_truststore(ca_file: Path, out: Path) -> None:
    """A PKCS12 truststore with the CA as a trusted certificate (keytool marks it trusted the
    way Java's PKCS12 reader needs; a plain PKCS12 of a certificate is not trusted by Java)."""
    keytool = shutil.which("keytool", path=os.pathsep.join(filter(None, [
        str(Path(os.environ["JAVA_HOME"]) / "bin") if os.environ.get("JAVA_HOME") else None, os.environ.get("PATH")])))
    if keytool is None:
        raise SecurityError("keytool (the JDK's) is not on PATH: the query server's JDBC truststore needs it")
    tmp = out.with_name(out.name + ".tmp")
    tmp.unlink(missing_ok=True)
    p = subprocess.run([keytool, "-importcert", "-noprompt", "-alias", "tidelog-sql-ca", "-file", str(ca_file),
                        "-keystore", str(tmp), "-storetype", "PKCS12", "-storepass", TRUSTSTORE_PASSWORD],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise SecurityError(f"keytool could not write {out}: {(p.stderr or p.stdout).strip()}")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


def _hive_site(d: Path, keystore: Path, password: str) -> Path:
    """HiveServer2's login and TLS settings, in a file only this user reads (on the driver's
    class path, where Hive looks for hive-site.xml)."""
    conf = {
        "hive.server2.authentication": "CUSTOM",
        "hive.server2.custom.authentication.class": AUTHENTICATOR_CLASS,
        "hive.server2.use.SSL": "true",
        "hive.server2.keystore.path": str(keystore),
        "hive.server2.keystore.password": password,
        # operations run as the session's user, so the SQL guard knows whose statement it checks
        "hive.server2.enable.doAs": "true",
        # a session may not name another user to run as (hive.server2.proxy.user)
        "hive.server2.allow.user.substitution": "false",
        "hive.server2.transport.mode": "binary",
    }
    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
                   for k, v in conf.items())
    out = _private_dir(d / "server-conf")
    write_atomic(out / "hive-site.xml", f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'.encode(),
                 0o600)
    return out


# --- the Java side -----------------------------------------------------------------------------

def java_sources() -> list[Path]:
    return sorted(JAVA_SOURCES.rglob("*.java"))


def compile_java(out_root: Path, jars: Path) -> Path:
    """The server's classes (authenticator, SQL guard) compiled with the JDK's javac against
    Spark's jars, once per version of the sources: out_root/<hash of the sources>/."""
    h = hashlib.sha256()
    for f in java_sources():
        h.update(f.relative_to(JAVA_SOURCES).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    out = Path(out_root) / h.hexdigest()[:16]
    if out.is_dir():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise SecurityError("javac (a JDK 17) is not on PATH: the query server compiles its login check with it "
                            "(apt-get install openjdk-17-jdk-headless)")
    Path(out_root).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="javac-", dir=out_root))
    try:
        p = subprocess.run([javac, "--release", "17", "-nowarn", "-Xlint:-path", "-encoding", "UTF-8",
                            "-cp", str(Path(jars) / "*"), "-d", str(tmp), *map(str, java_sources())],
                           capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S)
        if p.returncode != 0:
            raise SecurityError(f"javac failed on {JAVA_SOURCES}: " + " | ".join(p.stderr.strip().splitlines()[:5]))
        os.chmod(tmp, 0o700)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in Path(out_root).iterdir():  # other versions' classes (compiled only while no server runs)
        if old != out and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return out


def prepare_server(warehouse: Path, jars: Path, roots: list[Path] | None = None) -> tuple[ServerFiles, list[str]]:
    """Everything the query server needs to authenticate and guard (made or refreshed now);
    (the files, warnings about cluster users that could not be imported)."""
    d = _private_dir(security_dir(warehouse))
    keystore, password = _server_tls(warehouse)
    users, warnings = write_users(warehouse, roots)
    classes = compile_java(_private_dir(d / "java"), jars)
    return ServerFiles([classes, _hive_site(d, keystore, password)], users, public_ca(warehouse),
                       truststore(warehouse)), warnings


def server_conf(warehouse: Path, files: ServerFiles) -> dict[str, str]:
    """The Spark settings that turn the guard on (spark.sql.extensions is static: no client
    can change it) and tell the Java side where the users and the warehouse are."""
    return {
        "spark.sql.extensions": GUARD_CLASS,
        USERS_PROPERTY: str(files.users_file),
        WAREHOUSE_PROPERTY: str(Path(warehouse).resolve()),
        # defence in depth: the guard refuses path relations to non-admins anyway (a client
        # can change this one for its session)
        "spark.sql.runSQLOnFiles": "false",
    }


# --- clients -----------------------------------------------------------------------------------

def client_credentials(warehouse: Path, credentials: str | os.PathLike | None = None) -> Credentials:
    """Who `tidelog sql` (and ensure_catalog) logs in as, first found wins: `credentials` (a
    credentials file: --credentials), TIDELOG_USERNAME + TIDELOG_PASSWORD, TIDELOG_CREDENTIALS,
    else the warehouse admin's file when this user can read it (the operator). The CA is
    always the warehouse's (a cluster credentials file names the cluster's CA, not this one).
    Raises CredentialsError saying what to give."""
    creds = Credentials.resolve(credentials)
    if creds.username is None:
        admin = admin_credentials_file(warehouse)
        if not os.access(admin, os.R_OK):
            raise CredentialsError(
                f"the query server of {warehouse} needs a user: give --credentials FILE (a user's credentials "
                f"file, e.g. a cluster's <state>/security/<user>.credentials.yaml) or TIDELOG_USERNAME and "
                f"TIDELOG_PASSWORD (the warehouse admin's are in {admin}, readable by the server's operator)")
        creds = Credentials.load(admin)
    return replace(creds, ca_file=str(public_ca(warehouse)))


def catalog_credentials(warehouse: Path) -> Credentials:
    """Who changes the catalog through the server (ensure_catalog, the warm-up): the warehouse
    admin when this user can read its file, else whoever client_credentials finds (an admin
    of a cluster, say; a user who is not one is refused by the server)."""
    admin = admin_credentials_file(warehouse)
    if os.access(admin, os.R_OK):
        return replace(Credentials.load(admin), ca_file=str(public_ca(warehouse)))
    return client_credentials(warehouse)


def jdbc_url(host: str, port: int, warehouse: Path, database: str | None = None) -> str:
    """The URL beeline and JDBC tools connect with (user and password given apart: -n, -p)."""
    return (f"jdbc:hive2://{host}:{port}/{database or ''};ssl=true;sslTrustStore={truststore(warehouse)};"
            f"trustStorePassword={TRUSTSTORE_PASSWORD}")
