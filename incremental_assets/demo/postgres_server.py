"""A throwaway PostgreSQL server for the demo (``--postgres``), the tests and the
benchmarks: its own data folder and a free port on 127.0.0.1, every statement logged to a
file, removed when closed.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` system
user (created if missing). ``psql`` talks to it over its private Unix socket.

Example:
    >>> with PostgresServer.start() as pg:  # doctest: +SKIP
    ...     pg.create_database("shop")
    ...     pg.sql("CREATE TABLE t (id int)", database="shop")
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "postgres"
SUPERUSER_PASSWORD = "superuser-secret-7Qx"
JDBC_JAR = "/usr/share/java/postgresql.jar"
_OS_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started here (binaries missing, or it failed)."""


def find_bin_dir() -> Path:
    """The folder of ``initdb``/``pg_ctl``: ``INCREMENTAL_ASSETS_PG_BIN``, else the newest
    of Debian's /usr/lib/postgresql/<version>/bin, else the one on ``PATH`` (Homebrew,
    Fedora)."""
    explicit = os.environ.get("INCREMENTAL_ASSETS_PG_BIN")
    candidates = [explicit] if explicit else glob.glob("/usr/lib/postgresql/*/bin")
    found = [Path(c) for c in candidates if c and (Path(c) / "pg_ctl").exists()]
    on_path = shutil.which("pg_ctl")
    if not found and not explicit and on_path:
        found = [Path(on_path).resolve().parent]
    if not found:
        where = explicit or "/usr/lib/postgresql/*/bin or on PATH"
        raise PostgresUnavailable(
            f"PostgreSQL's server binaries (initdb, pg_ctl) not found in {where}: install "
            "PostgreSQL (Debian/Ubuntu: apt-get install postgresql; macOS: brew install "
            "postgresql) or set INCREMENTAL_ASSETS_PG_BIN to the folder holding pg_ctl"
        )
    return max(found, key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Statement:
    """One statement the server logged: the database, the user and the SQL text."""

    database: str
    user: str
    text: str


class PostgresServer:
    def __init__(self, bin_dir: Path, root: Path, port: int):
        self.bin_dir = bin_dir
        self.root = root
        self.port = port
        self.data_dir = root / "data"
        self.socket_dir = root
        self.log_file = root / "server.log"

    # -- life cycle -------------------------------------------------------------------

    @classmethod
    def start(cls, *, log_statements: bool = True) -> PostgresServer:
        """initdb a fresh cluster in a temporary folder and start it.

        Raises:
            PostgresUnavailable: with the reason (missing binaries, initdb or start log).
        """
        bin_dir = find_bin_dir()
        root = Path(tempfile.mkdtemp(prefix="ia-pg-"))
        server = cls(bin_dir, root, free_port())
        try:
            server._init(log_statements)
            server.resume()
        except BaseException:
            server.close()
            raise
        return server

    def _init(self, log_statements: bool) -> None:
        _chown_to_server_user(self.root)
        password_file = self.root / "superuser-password"
        password_file.write_text(SUPERUSER_PASSWORD + "\n")
        _chown_to_server_user(password_file)
        self._run_as_server(
            [
                str(self.bin_dir / "initdb"),
                "-D", str(self.data_dir),
                "-U", SUPERUSER,
                f"--pwfile={password_file}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
            "initdb",
        )  # fmt: skip
        password_file.unlink()
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "50",
            # A throwaway server: durability is not needed, speed is.
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "log_statement": "'all'" if log_statements else "'none'",
            "log_line_prefix": "'%m [%p] db=%d user=%u '",
            "timezone": "'UTC'",
        }
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def resume(self) -> None:
        """Start (or restart after :meth:`stop`) the server and wait until it accepts."""
        self._run_as_server(
            [
                str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir),
                "-l", str(self.log_file), "-w", "-t", "60", "start",
            ],
            "pg_ctl start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` drops connections without a clean shutdown)."""
        self._run_as_server(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"],
            "pg_ctl stop",
        )

    @property
    def running(self) -> bool:
        done = subprocess.run(
            [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
            capture_output=True,
        )
        return done.returncode == 0

    def close(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(PostgresUnavailable):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- SQL --------------------------------------------------------------------------

    def jdbc_url(self, database: str) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> list[list[str]]:
        """Run SQL as the superuser (over the Unix socket); rows as lists of text."""
        done = subprocess.run(
            [
                str(self.bin_dir / "psql"), "-X", "-q", "-A", "-t", "-F", "\t",
                "-v", "ON_ERROR_STOP=1",
                "-h", str(self.socket_dir), "-p", str(self.port),
                "-U", SUPERUSER, "-d", database,
            ],
            input=statement,
            capture_output=True,
            text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql failed ({done.returncode}): {done.stderr.strip()}")
        return [line.split("\t") for line in done.stdout.splitlines() if line]

    def create_database(self, name: str) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.sql(f'CREATE DATABASE "{name}"')

    def create_user(self, name: str, password: str) -> None:
        escaped = password.replace("'", "''")
        self.sql(
            f"""DO $$ BEGIN
                  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN
                    CREATE ROLE "{name}" LOGIN;
                  END IF;
                END $$;
                ALTER ROLE "{name}" PASSWORD '{escaped}';"""
        )

    # -- statement log ----------------------------------------------------------------

    def log_position(self) -> int:
        """Where the log ends now: pass it to :meth:`statements` to see later ones."""
        return self.log_file.stat().st_size if self.log_file.exists() else 0

    def statements(self, since: int = 0, database: str | None = None) -> list[Statement]:
        """Statements logged after ``since`` (log_statement=all), simple or prepared."""
        with self.log_file.open("rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", errors="replace")
        entries: list[Statement] = []
        current: Statement | None = None
        head = re.compile(r"db=(\S*) user=(\S*) (?:LOG|DETAIL|ERROR|FATAL|STATEMENT|HINT):")
        for line in text.splitlines():
            match = head.search(line)
            if match:
                current = None
                body = line[match.end() :].strip()
                sql = re.match(r"(?:statement|execute [^:]*): (.*)", body, re.S)
                if sql:
                    current = Statement(match.group(1), match.group(2), sql.group(1))
                    entries.append(current)
            elif current is not None and line.startswith("\t"):
                current.text += "\n" + line[1:]
        if database is not None:
            entries = [e for e in entries if e.database == database]
        return entries

    def log_text(self, since: int = 0) -> str:
        with self.log_file.open("rb") as log:
            log.seek(since)
            return log.read().decode("utf-8", errors="replace")

    # -- running as the server's OS user ------------------------------------------------

    def _run_as_server(self, command: list[str], what: str) -> None:
        done = subprocess.run(
            _as_server_user(command), capture_output=True, text=True, cwd=str(self.root)
        )
        if done.returncode != 0:
            tail = ""
            if self.log_file.exists():
                tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-15:])
            raise PostgresUnavailable(
                f"{what} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
                + (f"\nserver log:\n{tail}" if tail else "")
            )


def wait_until(condition, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    _ensure_os_user()
    return ["runuser", "-u", _OS_USER, "--", *command]


def _ensure_os_user() -> None:
    try:
        pwd.getpwnam(_OS_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _OS_USER],
            check=True,
            capture_output=True,
        )


def _chown_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        _ensure_os_user()
        entry = pwd.getpwnam(_OS_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)
