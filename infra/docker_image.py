"""The base image for provider `docker` where no image registry is reachable: a Debian bookworm
root filesystem built from Debian's own packages (debootstrap), imported into the engine.

    python -m infra.docker_image [--image tidelog-base:bookworm]   # build (once) and import

    debootstrap --variant=minbase --include=python3,python3-venv,openssh-server,iptables,procps
    tar -C rootfs -c . | docker import - tidelog-base:bookworm

What a host needs from its image (ops/nodes.py installs the rest over SSH, offline): python3.11
with venv/ensurepip (deploy makes a venv and installs the uploaded wheels with `pip --no-index`),
sshd (the provider's only way in), iptables (drill partitions, SSHFaults), procps. The root
filesystem tarball is cached in ~/.cache/tidelog/ (TIDELOG_CACHE_DIR): building it takes about a
minute, importing it into a fresh engine seconds. The SSH host keys openssh-server's postinst
generated inside the rootfs are removed, so no two containers share one: the provider gives each
container its own (and pins it in known_hosts).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMAGE = "tidelog-base:bookworm"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "openssh-server", "iptables", "procps")
MIRROR = os.environ.get("TIDELOG_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("TIDELOG_CACHE_DIR", "~/.cache/tidelog")).expanduser()
DEBOOTSTRAP_TIMEOUT_S = 900


class ImageError(RuntimeError):
    pass


def tarball_path(cache: Path = CACHE) -> Path:
    return cache / f"rootfs-{SUITE}-{'-'.join(PACKAGES)}.tar"


def _unmount_under(root: Path) -> None:
    """Unmount (lazily, deepest first) whatever is still mounted below `root`."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].encode().decode("unicode_escape") for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def rootfs_tarball(cache: Path = CACHE, mirror: str = MIRROR, log=lambda msg: None) -> tuple[Path, bool]:
    """The cached root filesystem tarball, built with debootstrap when missing; (path, built now)."""
    tar = tarball_path(cache)
    if tar.exists():
        return tar, False
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".rootfs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building it right now
        if tar.exists():
            return tar, False
        if os.geteuid() != 0:
            raise ImageError("building the base image needs root (debootstrap chroots and sets owners)")
        if not shutil.which("debootstrap"):
            raise ImageError("debootstrap is not installed: apt-get install debootstrap (make sysdeps does)")
        with tempfile.TemporaryDirectory(prefix="rootfs-", dir=cache) as tmp:
            rootfs = Path(tmp) / "rootfs"
            log(f"debootstrap {SUITE} (+{','.join(PACKAGES)}) from {mirror}")
            cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), mirror]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT_S)
            finally:
                _unmount_under(rootfs)  # debootstrap mounts /proc and /sys in there: never rm -r through them
            if p.returncode != 0:
                log_file = rootfs / "debootstrap" / "debootstrap.log"
                detail = log_file.read_text()[-1500:] if log_file.exists() else (p.stderr or p.stdout)[-1500:]
                raise ImageError(f"`{' '.join(cmd)}` failed ({p.returncode}): {detail}")
            for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
                key.unlink()  # made by openssh-server's postinst: every container would share them
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for f in (rootfs / junk).glob("*"):
                    if f.is_file():
                        f.unlink()
            part = Path(tmp) / "rootfs.tar"
            p = subprocess.run(["tar", "--numeric-owner", "--one-file-system", "-C", str(rootfs), "-cf", str(part), "."],
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise ImageError(f"tar of the root filesystem failed: {p.stderr.strip()[-500:]}")
            part.replace(tar)
    return tar, True


def ensure_image(client, image: str = IMAGE, cache: Path = CACHE, log=lambda msg: None) -> dict:
    """`image` present in the engine `client` talks to (a docker.DockerClient): imported from the
    cached tarball, built first if needed. What it did, with the seconds each step took."""
    import docker

    try:
        client.images.get(image)
        return {"image": image, "present": True}
    except docker.errors.ImageNotFound:
        pass
    t0 = time.monotonic()
    tar, built = rootfs_tarball(cache, log=log)
    t1 = time.monotonic()
    repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    log(f"docker import {tar} {image}")
    answer = client.api.import_image(src=str(tar), repository=repo, tag=tag)
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ImageError(f"docker import of {tar} did not make {image}: {str(answer)[-800:]}") from None
    return {"image": image, "present": False, "built": built, "tarball": str(tar),
            "build_s": round(t1 - t0, 1) if built else 0.0, "import_s": round(time.monotonic() - t1, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.docker_image", description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default=IMAGE)
    ap.add_argument("--rootfs-only", action="store_true", help="build the cached tarball, import nothing")
    a = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        if a.rootfs_only:
            tar, built = rootfs_tarball(log=say)
            print(f"{tar} ({'built' if built else 'cached'})")
            return 0
        import docker

        print(ensure_image(docker.from_env(), a.image, log=say))
        return 0
    except (ImageError, subprocess.TimeoutExpired) as e:
        say(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
