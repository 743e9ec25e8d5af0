"""Replicas of one profile behind haproxy, on this machine (`specdec replicas`).

Each replica is a `specdec serve` of its own (supervised: a dead tritonserver or Python stub is
started again, SIGTERM drains) on free ports of 127.0.0.1, with a build folder of its own under
the profile's (`replicas/r<i>`: its state file, drain flag, logs and rendered repository cannot be
shared) that serves the profile's converted weights in place. haproxy (Debian's, 2.6) takes
Triton's HTTP and gRPC APIs and the OpenAI-compatible API on the profile's ports and sends each
request to the replica with the fewest in flight, among those whose GET /health/ready (on the
replica's OpenAI-compatible frontend: the supervisor's state and tritonserver's readiness) answers
200. Its configuration is deploy/haproxy/haproxy.cfg.template, where the haproxy facts relied on
are named. Two replicas on one machine share its cores: this shows routing, health checks and
failover, not more throughput.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from string import Template

import psutil

from specdec.config import REPO_ROOT, ModelSource, Profile, ProfileError
from specdec.triton.serve import (
    Ports,
    ServerError,
    descendants,
    free_port,
    read_state,
    state_path,
)

HAPROXY_TEMPLATE = REPO_ROOT / "deploy" / "haproxy" / "haproxy.cfg.template"
STATS_PORT = 8404  # haproxy's customary stats port
# The backend whose servers are checked (their GET /health/ready), and those that track them.
CHECKED, TRACKING = "openai", ("triton_http", "triton_grpc")
BACKENDS = (CHECKED, *TRACKING)
STOP_S = 60.0  # a replica's `specdec serve` drains (15 s at most) and stops tritonserver (15 s)


def find_haproxy() -> Path:
    """Debian's haproxy (in /usr/sbin, which a user's PATH may lack)."""
    for candidate in (shutil.which("haproxy"), "/usr/sbin/haproxy", "/usr/local/sbin/haproxy"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise ServerError("haproxy is not installed: `./run` installs Debian's (apt-get install haproxy)")


def haproxy_version(binary: Path | None = None) -> str:
    """The version `haproxy -v` reports (2.6.12-1+deb12u4)."""
    out = subprocess.run([str(binary or find_haproxy()), "-v"], capture_output=True, text=True, check=True).stdout
    return out.split()[2] if out.startswith("HAProxy version") else out.strip()


def replicas_root(base: Profile) -> Path:
    return base.build_path() / "replicas"


def replica_profile(base: Profile, index: int, count: int) -> Profile:
    """Replica `index` of `count` of `base`: the same name (the model clients name), a build
    folder of its own, base's converted weights used in place (base must be built), and on a
    CPU whose threads the profile leaves to the engine, an equal share of the cores each."""
    if base.backend != "pytorch":
        raise ProfileError(
            f"{base.name}: `specdec replicas` runs replicas of a PyTorch-engine profile; a TensorRT-LLM "
            "engine is built for its build folder (deploy/kubernetes runs GPU replicas)"
        )
    update: dict[str, object] = {
        "target": ModelSource(hf_dir=str(base.model_dir("target"))),
        "draft": ModelSource(hf_dir=str(base.model_dir("draft"))) if base.draft is not None else None,
        "build_dir": str(replicas_root(base) / f"r{index}"),
    }
    if base.engine.device == "cpu" and base.engine.threads is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        update["engine"] = base.engine.model_copy(update={"threads": max(1, cores // count)})
    return base.model_copy(update=update)


@dataclass(frozen=True)
class BalancerPorts:
    http: int
    grpc: int
    openai: int
    stats: int = STATS_PORT

    @classmethod
    def of(cls, profile: Profile) -> BalancerPorts:
        """The profile's ports (a client of one `specdec serve` finds the balancer where the
        server was); the OpenAI API on 9000 where the profile serves none."""
        s = profile.server
        return cls(s.http_port, s.grpc_port, s.openai_port or 9000)

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> BalancerPorts:
        return cls(free_port(host), free_port(host), free_port(host), free_port(host))


def render_haproxy(replicas: Sequence[Ports], host: str, ports: BalancerPorts, stats_socket: Path,
                   replica_host: str = "127.0.0.1") -> str:  # fmt: skip
    """haproxy's configuration for replicas r0, r1, ... at `replicas` (each with its OpenAI
    frontend, whose GET /health/ready is the replica's readiness)."""

    def servers(line: Callable[[str, Ports], str]) -> str:
        return "\n".join(f"    server r{i} {line(f'r{i}', p)}" for i, p in enumerate(replicas))

    return Template(HAPROXY_TEMPLATE.read_text()).substitute(
        host=host,
        http_port=ports.http,
        grpc_port=ports.grpc,
        openai_port=ports.openai,
        stats_port=ports.stats,
        stats_socket=stats_socket,
        openai_servers=servers(lambda name, p: f"{replica_host}:{p.openai} check"),
        http_servers=servers(lambda name, p: f"{replica_host}:{p.http} track {CHECKED}/{name}"),
        grpc_servers=servers(lambda name, p: f"{replica_host}:{p.grpc} proto h2 track {CHECKED}/{name}"),
    )


def check_config(path: Path, binary: Path | None = None) -> None:
    """`haproxy -c`: ServerError with haproxy's words when the configuration is not valid."""
    done = subprocess.run([str(binary or find_haproxy()), "-c", "-f", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ServerError(f"haproxy rejects {path}:\n{done.stdout}{done.stderr}")


def show_stat(stats_socket: Path | str, timeout: float = 2.0) -> list[dict[str, str]]:
    """haproxy's `show stat` over its stats socket: one row per frontend, backend and server
    (management.txt 9.1: pxname, svname, status, scur, stot, check_status, ...)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(stats_socket))
        sock.sendall(b"show stat\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    text = b"".join(chunks).decode("utf-8", errors="replace").removeprefix("# ")
    return list(csv.DictReader(io.StringIO(text)))


def server_states(stats_socket: Path | str) -> dict[tuple[str, str], str]:
    """{(backend, server): "UP" | "DOWN" | "UP 1/2" (going down) | ...} of the replicas' servers;
    {} when haproxy does not answer."""
    try:
        rows = show_stat(stats_socket)
    except OSError:
        return {}
    return {(r["pxname"], r["svname"]): r["status"] for r in rows if r["pxname"] in BACKENDS
            and r["svname"] not in ("FRONTEND", "BACKEND")}  # fmt: skip


def replica_status(states: dict[tuple[str, str], str], name: str) -> str:
    """One replica's status over the three backends: UP or DOWN when they agree (tracking makes
    them), else what each says."""
    seen = {states.get((backend, name), "?") for backend in BACKENDS}
    return seen.pop() if len(seen) == 1 else ", ".join(f"{b} {states.get((b, name), '?')}" for b in BACKENDS)


@dataclass
class ReplicaInfo:
    name: str  # haproxy's server name: r0, r1, ...
    ports: Ports
    build_dir: str
    pid: int  # its `specdec serve`
    log: str

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def tritonserver_pid(self) -> int | None:
        """Its tritonserver now (None while there is none: starting, restarting, stopped)."""
        for process in descendants(self.pid):
            with contextlib.suppress(psutil.Error):
                if process.name() == "tritonserver":
                    return process.pid
        return None


@dataclass
class ClusterInfo:
    """What a running `specdec replicas` serves, written to <replicas>/cluster.json when ready."""

    host: str
    ports: BalancerPorts
    stats_socket: str
    balancer_pid: int
    haproxy_version: str
    replicas: list[ReplicaInfo] = field(default_factory=list)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def openai_url(self) -> str:
        return f"http://{self.host}:{self.ports.openai}/v1"

    @property
    def stats_url(self) -> str:
        return f"http://{self.host}:{self.ports.stats}/"

    def states(self) -> dict[str, str]:
        """Each replica's status at the balancer (UP, DOWN, ...)."""
        states = server_states(self.stats_socket)
        return {r.name: replica_status(states, r.name) for r in self.replicas}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> ClusterInfo:
        data = json.loads(path.read_text())
        replicas = [ReplicaInfo(**{**r, "ports": Ports(**r["ports"])}) for r in data.pop("replicas")]
        return cls(**{**data, "ports": BalancerPorts(**data["ports"])}, replicas=replicas)


class Replica:
    """One `specdec serve` of a replica profile, in a session of its own (a Ctrl-C at the
    terminal reaches `specdec replicas`, which stops each replica in turn)."""

    def __init__(self, profile: Profile, name: str, ports: Ports):
        self.profile, self.name, self.ports = profile, name, ports
        self.log_file = profile.build_path() / "logs" / "serve.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        from specdec.build.repository import resolved_profile_path

        p = self.ports
        return [sys.executable, "-m", "specdec.cli", "serve", f"--profile={resolved_profile_path(self.profile)}",
                "--no-build", "--host=127.0.0.1", f"--http-port={p.http}", f"--grpc-port={p.grpc}",
                f"--metrics-port={p.metrics}", f"--openai-port={p.openai}"]  # fmt: skip

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        state_path(self.profile).unlink(missing_ok=True)  # a state left by an earlier run is not this one's
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip

    def state(self) -> str:
        return read_state(self.profile)[0]

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def info(self) -> ReplicaInfo:
        assert self.process is not None
        return ReplicaInfo(self.name, self.ports, str(self.profile.build_path()), self.process.pid, str(self.log_file))

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def terminate(self) -> list[psutil.Process]:
        """SIGTERM (it drains, then stops its server); what it started, for kill()."""
        if self.process is None or self.process.poll() is not None:
            return []
        started = descendants(self.process.pid)
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        return started

    def kill(self, started: Sequence[psutil.Process]) -> None:
        """Whatever is left of it: its `specdec serve`, and the tritonserver, stubs and frontend
        it started (sessions of their own, which its process group does not reach)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for process in [*started, *descendants(self.process.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()


class Balancer:
    """haproxy in the foreground (-db), its log in <dir>/haproxy.log."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.config = directory / "haproxy.cfg"
        self.stats_socket = directory / "haproxy.sock"
        self.log_file = directory / "haproxy.log"
        self.process: subprocess.Popen | None = None
        self.binary = find_haproxy()

    def write_config(self, replicas: Sequence[Ports], host: str, ports: BalancerPorts) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(render_haproxy(replicas, host, ports, self.stats_socket))
        check_config(self.config, self.binary)
        return self.config

    def start(self, timeout: float = 10.0) -> None:
        self.stats_socket.unlink(missing_ok=True)
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen([str(self.binary), "-db", "-f", str(self.config)], stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"haproxy exited ({self.process.returncode}):\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                show_stat(self.stats_socket)
                return
            time.sleep(0.1)
        raise ServerError(f"haproxy's stats socket did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, timeout: float = 5.0) -> None:
        """A soft stop (SIGUSR1: it stops listening and waits for the requests still open),
        then a hard one."""
        proc, self.process = self.process, None
        if proc is None:
            return
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        proc.wait()
        self.stats_socket.unlink(missing_ok=True)


class Cluster:
    """`count` replicas of `base` behind haproxy. start(), wait_ready(), watch(), stop(); or a
    context manager for the first two and the last."""

    def __init__(self, base: Profile, count: int = 2, host: str | None = None, ports: BalancerPorts | None = None):
        if count < 1:
            raise ValueError("at least one replica")
        self.base, self.count = base, count
        self.host = host or base.server.host
        self.ports = ports or BalancerPorts.of(base)
        self.root = replicas_root(base)
        self.replicas: list[Replica] = []
        self.balancer: Balancer | None = None
        self.info: ClusterInfo | None = None

    @property
    def info_path(self) -> Path:
        return self.root / "cluster.json"

    def build(self) -> None:
        """The base profile's build (weights converted once), then each replica's repository."""
        from specdec.build import build

        build(self.base)
        for i in range(self.count):
            build(replica_profile(self.base, i, self.count))

    def start(self) -> None:
        """Start the replicas and haproxy (its configuration checked first); wait_ready() next."""
        self.info_path.unlink(missing_ok=True)
        self.balancer = Balancer(self.root / "balancer")
        replica_ports = [Ports.free() for _ in range(self.count)]
        self.balancer.write_config(replica_ports, self.host, self.ports)
        self.replicas = [Replica(replica_profile(self.base, i, self.count), f"r{i}", p)
                         for i, p in enumerate(replica_ports)]  # fmt: skip
        for replica in self.replicas:
            replica.start()
        self.balancer.start()

    def states(self) -> dict[str, str]:
        assert self.balancer is not None
        states = server_states(self.balancer.stats_socket)
        return {r.name: replica_status(states, r.name) for r in self.replicas}

    def failure(self) -> str | None:
        """Why the cluster cannot serve: haproxy exited, or every replica did."""
        assert self.balancer is not None and self.balancer.process is not None
        if (code := self.balancer.process.poll()) is not None:
            return f"haproxy exited ({code}):\n{self.balancer.log_tail()}"
        if all(r.exited() is not None for r in self.replicas):
            return "every replica's `specdec serve` exited:\n" + "\n".join(
                f"{r.name} ({r.exited()}), its log ends:\n{r.log_tail(15)}" for r in self.replicas
            )
        return None

    def wait_ready(self, timeout: float | None = None) -> ClusterInfo:
        """Until haproxy has every replica UP (ServerError if one exits or the time runs out:
        default the profile's server.ready_timeout_s); writes and returns the ClusterInfo."""
        assert self.balancer is not None and self.balancer.process is not None
        timeout = self.base.server.ready_timeout_s + 30 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            if failure := self.failure():
                raise ServerError(failure)
            if gone := [r for r in self.replicas if r.exited() is not None]:
                r = gone[0]
                raise ServerError(f"replica {r.name}'s `specdec serve` exited ({r.exited()}); its log ends:\n"
                                  f"{r.log_tail()}")  # fmt: skip
            states = self.states()
            if all(s == "UP" for s in states.values()):
                break
            if time.monotonic() > deadline:
                raise ServerError(f"not every replica ready after {timeout:.0f} s: {states}")
            time.sleep(0.5)
        self.info = ClusterInfo(self.host, self.ports, str(self.balancer.stats_socket), self.balancer.process.pid,
                                haproxy_version(self.balancer.binary), [r.info() for r in self.replicas])  # fmt: skip
        self.info.write(self.info_path)
        return self.info

    def watch(self, say: Callable[[str], None], poll_s: float = 0.5) -> int:
        """Report each replica going down or up at the balancer, and each that exits, until
        haproxy exits or every replica has (1); Ctrl-C reaches the caller."""
        last = self.states()
        reported: set[str] = set()
        while True:
            if failure := self.failure():
                say(f"[red]{failure}[/]")
                return 1
            for r in self.replicas:
                if r.exited() is not None and r.name not in reported:
                    reported.add(r.name)
                    say(f"[red]replica {r.name}'s `specdec serve` exited ({r.exited()}, {r.state() or 'no state'})"
                        f"[/]; the others go on. Its log: {r.log_file}")  # fmt: skip
            states = self.states()
            for name, status in states.items():
                if status != last.get(name):
                    colour = "green" if status == "UP" else "yellow"
                    say(f"{name}: [{colour}]{status}[/] at the balancer (its supervisor: {self.state_of(name)})")
            last = states
            time.sleep(poll_s)

    def state_of(self, name: str) -> str:
        replica = next(r for r in self.replicas if r.name == name)
        return replica.state() or "no state"

    def stop(self) -> None:
        """Every replica drains and stops (in parallel), then haproxy; nothing is left running."""
        self.info_path.unlink(missing_ok=True)
        started = {r.name: r.terminate() for r in self.replicas}
        deadline = time.monotonic() + STOP_S
        for r in self.replicas:
            if r.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            r.kill(started[r.name])
        if self.balancer is not None:
            self.balancer.stop()

    def __enter__(self) -> Cluster:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
