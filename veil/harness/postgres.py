"""A PostgreSQL server of its own, in a temporary directory on a free loopback port (`initdb` and
`pg_ctl` from the PATH or Debian's /usr/lib/postgresql/*/bin), and a fresh database per user of it.

initdb refuses to run as root: under root the server runs as the `postgres` user, which Debian's
package creates."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator

import psycopg

from veil.harness.broker import free_ports

START_TIMEOUT = 60


def binaries() -> str | None:
    """The directory holding initdb and pg_ctl, if PostgreSQL's binaries are installed."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(found))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(versions[-1]) if versions else None


class PostgresServer:
    def __init__(self) -> None:
        self.bin = binaries()
        if self.bin is None:
            raise FileNotFoundError(
                "PostgreSQL's initdb and pg_ctl are not installed (Debian: apt-get install postgresql)"
            )
        self.directory = tempfile.mkdtemp(prefix="veil-postgres-")
        self.data = os.path.join(self.directory, "data")
        (self.port,) = free_ports(1)
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        """The administrator's URL (superuser `veil`, trust authentication on loopback)."""
        return f"postgresql://veil@127.0.0.1:{self.port}/postgres"

    def start(self, **settings: str) -> PostgresServer:
        """Start the server, with these server settings besides its own (`shared_preload_libraries=...`)."""
        self._run("initdb", "-D", self.data, "-U", "veil", "-A", "trust", "-E", "UTF8", "--no-instructions")
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c max_connections=200"
        options += "".join(f" -c {name}={value}" for name, value in settings.items())
        self._run(
            "pg_ctl", "-D", self.data, "-l", os.path.join(self.directory, "server.log"), "-w", "-t", str(START_TIMEOUT),
            "-o", options, "start",
        )  # fmt: skip
        return self

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [*self._as, os.path.join(self.bin, program), *args],  # type: ignore[arg-type]  # all strings
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=START_TIMEOUT + 30,
        )  # fmt: skip


@contextlib.contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A new, empty database on the server `admin_url` names, dropped afterwards; yields its URL."""
    name = f"veil_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urllib.parse.urlsplit(admin_url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
