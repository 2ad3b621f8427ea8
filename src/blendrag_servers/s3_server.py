"""A throwaway S3 server on loopback: Ceph's RADOS Gateway over a one-monitor, one-OSD cluster
(BlueStore on a sparse file), in a temporary directory, every daemon a child process stopped
by its PID. The S3 tier tests and the store benchmarks start theirs with ``LocalS3``.

Needs Debian's ``ceph-mon ceph-osd radosgw`` packages (``apt-get install -y
--no-install-recommends ceph-mon ceph-osd radosgw``, about 270 MB); start-up takes 10-20 s.
RGW's beast frontend is given ``tcp_nodelay=1``: without it every small ranged GET waits out
Nagle's delay (tens of milliseconds).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from blendrag_servers.redis_server import free_port

BINARIES = ("ceph-authtool", "monmaptool", "ceph-mon", "ceph-osd", "ceph", "radosgw",
            "radosgw-admin")
ACCESS_KEY, SECRET_KEY = "blendrag", "blendrag-local-secret"


class S3Unavailable(RuntimeError):
    """No local S3 server can be started here; the message says why."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


class LocalS3:
    """Ceph RGW on 127.0.0.1:``port`` with one user (``ACCESS_KEY``/``SECRET_KEY``) and one
    bucket; ``endpoint`` is its URL, ``credentials()`` the keyword arguments of a boto3 client."""

    def __init__(self, bucket: str = "blendrag-test", timeout_s: float = 90.0) -> None:
        if missing := missing_binaries():
            raise S3Unavailable(f"{', '.join(missing)} not on PATH (apt-get install -y "
                                "--no-install-recommends ceph-mon ceph-osd radosgw)")
        self._tmp = tempfile.TemporaryDirectory(prefix="blendrag-s3-")
        self.dir = Path(self._tmp.name)
        self.mon_port, self.port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self._procs: list[subprocess.Popen] = []
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def credentials(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, "aws_access_key_id": ACCESS_KEY,
                "aws_secret_access_key": SECRET_KEY, "region_name": "us-east-1"}

    def env(self) -> dict[str, str]:
        """boto3's environment variables for this server's user (for a child process)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):
        """A boto3 S3 client of this server."""
        import boto3
        import botocore.config

        return boto3.session.Session().client(
            "s3", config=botocore.config.Config(s3={"addressing_style": "path"}),
            **self.credentials())

    def _start(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        conf = self._write_config()
        self._run("monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{self.mon_port}]",
                  "--fsid", self._fsid, str(self.dir / "monmap"))
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(self.dir / "monmap"),
                  "--keyring", str(self.dir / "keyring"), "-c", conf)
        self._spawn("ceph-mon", "-f", "-i", "a", "-c", conf)
        osd_uuid = str(uuid.uuid4())
        self._run("ceph", "-c", conf, "--connect-timeout", "30", "osd", "new", osd_uuid)
        self._run("ceph-osd", "-i", "0", "--mkfs", "--osd-uuid", osd_uuid, "-c", conf)
        self._spawn("ceph-osd", "-f", "-i", "0", "-c", conf)
        self._conf = conf
        self.start_gateway(timeout_s)
        self._run("radosgw-admin", "-c", conf, "user", "create", "--uid=blendrag",
                  "--display-name=blendrag", f"--access-key={ACCESS_KEY}",
                  f"--secret={SECRET_KEY}")
        while True:  # the first bucket waits for RGW's pools to be created
            try:
                self.client().create_bucket(Bucket=self.bucket)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def start_gateway(self, timeout_s: float = 60.0) -> None:
        """Start RGW (again) and wait until it answers HTTP."""
        self._gateway = subprocess.Popen(["radosgw", "-f", "-n", "client.rgw.a", "-c", self._conf],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._procs.append(self._gateway)
        self._wait_http(time.monotonic() + timeout_s)

    def stop_gateway(self) -> None:
        """Stop RGW only (the server goes away; the cluster and its objects stay)."""
        self._gateway.terminate()
        self._gateway.wait(timeout=20)
        self._procs.remove(self._gateway)

    def _write_config(self) -> str:
        d = self.dir
        for sub in ("run", "log", "mon.a", "osd.0", "rgw"):
            (d / sub).mkdir()
        self._fsid = str(uuid.uuid4())
        keyring = d / "keyring"
        tool = ["ceph-authtool", str(keyring)]
        self._run(*tool, "--create-keyring", "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
        self._run(*tool, "--gen-key", "-n", "client.admin", "--cap", "mon", "allow *",
                  "--cap", "osd", "allow *", "--cap", "mgr", "allow *")
        self._run(*tool, "--gen-key", "-n", "osd.0", "--cap", "mon", "allow profile osd",
                  "--cap", "osd", "allow *")
        self._run(*tool, "--gen-key", "-n", "client.rgw.a", "--cap", "mon", "allow rw",
                  "--cap", "osd", "allow rwx")
        conf = d / "ceph.conf"
        conf.write_text(f"""[global]
fsid = {self._fsid}
mon host = [v2:127.0.0.1:{self.mon_port}]
public addr = 127.0.0.1
ms bind ipv6 = false
keyring = {keyring}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon max pg per osd = 1000
osd crush chooseleaf type = 0
mon data avail crit = 1
mon data avail warn = 2
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
[mon.a]
mon data = {d}/mon.a
[osd.0]
osd data = {d}/osd.0
osd objectstore = bluestore
bluestore block path = {d}/osd0.block
bluestore block create = true
bluestore block size = {4 << 30}
osd memory target = {512 << 20}
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{self.port} tcp_nodelay=1
rgw data = {d}/rgw
""")
        return str(conf)

    def _run(self, *cmd: str) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            why = (done.stderr or done.stdout)[-400:]
            raise S3Unavailable(f"{' '.join(cmd[:3])} failed: {why}")

    def _spawn(self, *cmd: str) -> None:
        self._procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))

    def _wait_http(self, deadline: float) -> None:
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
                return
            except OSError:
                dead = [p.args[0] for p in self._procs if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    why = f"{', '.join(dead)} exited" if dead else "no answer"
                    raise S3Unavailable(f"Ceph RGW did not start ({why}); logs in "
                                        f"{self.dir / 'log'}") from None
                time.sleep(0.25)

    def stop(self) -> None:
        """Stop the daemons (gateway first) by their PIDs and remove the directory."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        self._tmp.cleanup()

    def __enter__(self) -> LocalS3:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
