"""A private PostgreSQL cluster that a test may stop, restart or kill (never the shared one).

``initdb`` into a temporary directory and ``pg_ctl start`` on a free port, trust authentication,
fsync off. When the tests run as root, the cluster runs as the ``postgres`` user (PostgreSQL
refuses root). ``stop`` is a fast shutdown: open connections are cut, as in a restart.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.integration.helpers import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def available() -> bool:
    """Whether initdb and pg_ctl are installed (and, as root, a ``postgres`` user exists)."""
    if _bindir() is None:
        return False
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return False
    return True


class PostgresServer:
    """A private cluster on a free loopback port; ``url()`` is its ``postgres`` database."""

    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir is not None, "PostgreSQL binaries not found"
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="specrag-pg-"))
        self.data = self.root / "data"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        conf = self.data / "postgresql.conf"
        with conf.open("a") as f:
            f.write(f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nfsync = off\n")
            f.write(f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        argv = [str(self.bindir / tool), *args]
        if self._as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        """Start the cluster and wait until it accepts connections."""
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Fast shutdown: connections are cut, the cluster is down until ``start``."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def restart_after(self, seconds: float) -> float:
        """Stop, stay down ``seconds``, start again; returns how long it was unreachable."""
        started = time.monotonic()
        self.stop()
        time.sleep(seconds)
        self.start()
        return time.monotonic() - started

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its URL."""
        import psycopg

        raw = self.url().replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(raw, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        """Stop the cluster (immediately) and delete its files."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
