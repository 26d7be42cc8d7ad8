"""A throw-away PostgreSQL server for the ecosystem suites and the app benchmarks.

Debian's PostgreSQL (tools/ensure_debian_package.sh postgresql) refuses to run
as root, and CI runs as root: the cluster is made in a temporary directory
owned by an unprivileged user (``postgres`` when it exists, else ``nobody``)
and started through ``runuser``.  Authentication is ``trust`` on 127.0.0.1 and
on the Unix socket inside the directory; the superuser is ``postgres``.

    with PgCluster() as pg:          # in Python
        pg.dsn                       # postgresql://postgres@127.0.0.1:PORT/postgres

    python tools/pgcluster.py start DIR   # by hand: prints PGHOST/PGPORT/PGUSER lines
    python tools/pgcluster.py stop DIR
"""
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def postgres_bindir():
    """The newest Debian PostgreSQL's bin directory (it holds initdb)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not found:
        raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb: run "
                           "'bash tools/ensure_debian_package.sh postgresql' first")
    return os.path.dirname(found[-1])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_user():
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
    raise RuntimeError("no unprivileged user (postgres, nobody) to run PostgreSQL as")


class PgCluster:
    """initdb + pg_ctl start on enter; pg_ctl stop and rm -r on exit."""

    def __init__(self, directory=None, port=None, settings=None):
        self.owns_directory = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="tideloop-pg-")
        self.port = port or _free_port()
        self.settings = {"max_connections": "200", "fsync": "off",
                         "synchronous_commit": "off", "full_page_writes": "off",
                         **(settings or {})}
        self.bindir = postgres_bindir()
        self.datadir = os.path.join(self.directory, "data")
        self.user = None if os.geteuid() else _server_user()

    # the server's own commands run as the unprivileged user when we are root
    def _run(self, *argv, check=True):
        argv = [os.path.join(self.bindir, argv[0]), *argv[1:]]
        if self.user is not None:
            argv = ["runuser", "-u", self.user.pw_name, "--", *argv]
        return subprocess.run(argv, check=check, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)

    @property
    def host(self):
        return "127.0.0.1"

    @property
    def socket_dir(self):
        return self.directory

    @property
    def dsn(self):
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def env(self):
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": "postgres",
                "PGDATABASE": "postgres"}

    def start(self):
        if self.user is not None:
            os.chown(self.directory, self.user.pw_uid, self.user.pw_gid)
            os.chmod(self.directory, 0o755)
        if not os.path.exists(os.path.join(self.datadir, "PG_VERSION")):
            out = self._run("initdb", "-D", self.datadir, "-U", "postgres", "-A", "trust",
                            "-E", "UTF8", "--no-sync", check=False)
            if out.returncode:
                raise RuntimeError(f"initdb failed:\n{out.stdout}")
        opts = " ".join([f"-p {self.port}", "-h 127.0.0.1", f"-k {self.socket_dir}",
                         *(f"-c {k}={v}" for k, v in self.settings.items())])
        log = os.path.join(self.directory, "server.log")
        out = self._run("pg_ctl", "-D", self.datadir, "-l", log, "-o", opts, "-w",
                        "-t", "60", "start", check=False)
        if out.returncode:
            tail = open(log).read()[-2000:] if os.path.exists(log) else ""
            raise RuntimeError(f"pg_ctl start failed:\n{out.stdout}\n{tail}")
        self._wait_ready()
        return self

    def _wait_ready(self, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not listen on port {self.port}")
                time.sleep(0.1)

    def stop(self):
        if os.path.exists(os.path.join(self.datadir, "postmaster.pid")):
            self._run("pg_ctl", "-D", self.datadir, "-m", "fast", "-w", "stop", check=False)
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


def main(argv):
    if len(argv) != 3 or argv[1] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    directory = os.path.abspath(argv[2])
    os.makedirs(directory, exist_ok=True)
    cluster = PgCluster(directory)
    if argv[1] == "start":
        cluster.start()
        for key, value in cluster.env().items():
            print(f"{key}={value}")
    else:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
