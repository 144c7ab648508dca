"""A throwaway PostgreSQL server for the tests: Debian's ``postgresql`` binaries, a cluster
in a temporary folder, reachable only through a Unix socket in that folder, stopped at the end.

PostgreSQL refuses to run as root, so under root (CI) the cluster belongs to the
``postgres`` user the Debian package creates and runs through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from speceyes_graph.models.servers import free_port  # never hands a port out twice

__all__ = ["PostgresServer", "PostgresUnavailable"]


class PostgresUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if versions:
        return Path(versions[-1]).parent
    raise PostgresUnavailable(
        "PostgreSQL is not installed: run scripts/setup.sh (it installs Debian's postgresql), "
        "or deselect these tests with -m 'not postgres'"
    )


class PostgresServer:
    """``with PostgresServer(folder) as pg: pg.dsn("mydb")``."""

    user = "speceyes"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.data = self.root / "data"
        self.socket_dir = self.root / "socket"
        self.port = free_port()  # names the socket file; nothing listens on TCP
        self.bin = _bindir()
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, timeout=120, cwd=self.root
        )
        if done.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> PostgresServer:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.socket_dir, "postgres")
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
            "-E", "UTF8", "--no-instructions",
        )  # fmt: skip
        options = (
            f"-k {self.socket_dir} -p {self.port} -c listen_addresses='' "
            "-c fsync=off -c synchronous_commit=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.root / "server.log"), "-w", "-t", "60", "start",
        )  # fmt: skip
        return self

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@/{database}?host={self.socket_dir}&port={self.port}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(
                str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"
            )

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
