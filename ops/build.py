"""What gets installed on hosts: a wheel of Tidelog plus a wheelhouse of its dependencies.

`artifact("current")` builds a wheel of this source tree; `artifact("0.2.0")` finds
`tidelog-0.2.0-*.whl` in the wheels directory (or builds this tree when it is that version);
`artifact("path/to/x.whl")` takes that wheel. Each artifact has a build id (a hash of the
wheel's contents, excluding zip timestamps), so a host installs each build once, in its own
directory `versions/<version>-<build id>`, side by side with the others: an upgrade installs
before it stops anything and a rollback has nothing to reinstall.

Hosts install with `pip --no-index` from the uploaded wheelhouse: they need no PyPI access.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[1]
CACHE = Path("~/.tidelog/build").expanduser()
PACKAGES = ("broker", "replication", "ops", "infra", "spark_jobs", "expectations", "bench")


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Artifact:
    version: str
    wheel: Path | None   # None: run this tree's code in place (provider local, version current)
    build_id: str

    @property
    def name(self) -> str:
        """The directory a host installs it into."""
        return f"{self.version}-{self.build_id}"


def tree_version(root: Path = SOURCE_ROOT) -> str:
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        raise BuildError(f"no source tree at {root} to build from (give --version a wheel path)") from None
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise BuildError(f"{root}/pyproject.toml has no version")
    return m.group(1)


def wheel_id(wheel: Path) -> str:
    """A hash of the files in a wheel (names and bytes), stable across rebuilds of one tree."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            if info.filename.endswith(".dist-info/RECORD"):
                continue
            h.update(info.filename.encode())
            h.update(z.read(info))
    return h.hexdigest()[:10]


def wheel_version(wheel: Path) -> str:
    m = re.match(r"tidelog-([^-]+)-", wheel.name)
    if not m:
        raise BuildError(f"{wheel} is not a tidelog wheel (tidelog-<version>-...whl)")
    return m.group(1)


def build_wheel(out_dir: Path, version: str | None = None, root: Path = SOURCE_ROOT) -> Path:
    """A wheel of the source tree (with its version replaced by `version` when given)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tidelog-build-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, src / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so")  # (.so: built in place here)
        for pkg in PACKAGES:
            if (root / pkg).is_dir():
                shutil.copytree(root / pkg, src / pkg, ignore=ignore)
        if version is not None:
            pp = src / "pyproject.toml"
            pp.write_text(re.sub(r'^version\s*=\s*"[^"]+"', f'version = "{version}"', pp.read_text(),
                                 count=1, flags=re.M))
        dist = Path(tmp) / "dist"
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "--disable-pip-version-check", "-w", str(dist), str(src)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise BuildError(f"building the wheel failed: {(p.stderr or p.stdout)[-1500:]}")
        (wheel,) = dist.glob("tidelog-*.whl")
        target = out_dir / wheel.name
        shutil.move(str(wheel), target)
        return target


def artifact(version: str, wheels_dir: Path | None = None, in_place_ok: bool = False) -> Artifact:
    """Resolve a spec's/CLI's version string to something installable."""
    if version.endswith(".whl"):
        wheel = Path(version).expanduser().resolve()
        if not wheel.exists():
            raise BuildError(f"wheel {wheel} does not exist")
        return Artifact(wheel_version(wheel), wheel, wheel_id(wheel))
    if version == "current" or version == _tree_version_or_none():
        if version == "current" and in_place_ok:
            return Artifact(tree_version(), None, "src")
        wheel = build_wheel(CACHE / "current")
        return Artifact(wheel_version(wheel), wheel, wheel_id(wheel))
    d = Path(wheels_dir or SOURCE_ROOT / "dist")
    found = sorted(d.glob(f"tidelog-{version}-*.whl"))
    if not found:
        raise BuildError(f"no wheel for version {version} in {d} (tidelog-{version}-*.whl); build one "
                         f"(pip wheel .) or pass a wheel path")
    return Artifact(version, found[-1], wheel_id(found[-1]))


def _tree_version_or_none() -> str | None:
    try:
        return tree_version()
    except BuildError:
        return None


def wheelhouse(wheel: Path) -> Path:
    """A directory with every dependency wheel `wheel` needs (cached per dependency set)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        reqs = sorted(line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines()
                      if line.startswith("Requires-Dist:") and "extra ==" not in line)
    key = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:12]
    d = CACHE / "wheelhouse" / key
    if (d / ".complete").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                        "-w", str(d), *reqs], capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"collecting dependency wheels failed: {(p.stderr or p.stdout)[-1500:]}")
    (d / ".complete").write_text("\n".join(reqs) + "\n")
    return d
