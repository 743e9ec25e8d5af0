"""The tritonserver process: which binary, its Python backend, its flags, start, ready, stop.

Clients reach the server's edge (specdec/triton/edge.py) on the profile's HTTP and gRPC ports:
tritonserver's own endpoints listen on 127.0.0.1, on ports drawn at each start, behind it. Each
start also draws the key the internal models take direct calls with (specdec/triton/internal.py).

On a GPU machine inside NVIDIA's Triton container the container's server is used. Elsewhere the
`nvidia-pytriton` wheel provides a real Triton server binary (2.51), its Python backend and a
backend stub per Python version; we assemble them into a backend folder of the build.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from specdec.config import Profile
from specdec.speculation.admission import CANCEL, DRAIN, drain_path
from specdec.triton.internal import KEY_ENV, InternalAccess, access_path, new_key, write_access_file
from specdec.triton.server_flags import frontend_access, server_flags, stream_key

CONTAINER_SERVER = Path("/opt/tritonserver")
CONTAINER_BINARY = CONTAINER_SERVER / "bin" / "tritonserver"  # tritonserver 2.61 in the GPU image
LOOPBACK = "127.0.0.1"  # where tritonserver's own endpoints listen, behind the edge
IN_FLIGHT = ("specdec_requests_running{", "specdec_requests_queued{")  # spec_decode's gauges
# glibc's malloc for tritonserver and its stubs (they inherit it; an operator's own setting of
# either wins). Each of tritonserver's many threads frees into an arena of its own (8 a core),
# which keeps what it freed, and a freed buffer over the mmap threshold raises the threshold to its
# size, so that later buffers of that size come from the arenas and stay there too: resident
# memory climbs for hundreds of requests while the heap in use does not. Two arenas and a fixed
# threshold keep it nearer to what is in use: less resident memory in the engines' stubs and a
# flatter slope in every process (benchmarks/soak.py measures both).
MALLOC_SETTINGS = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def terminate(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, and SIGKILL if the process has not exited within `timeout` seconds; reaped."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path  # contains python/ (libtriton_python.so, utils, stub)
    library_dirs: tuple[Path, ...] = ()


def find_triton(build_dir: Path, standin: bool = False) -> TritonInstall:
    """The container's tritonserver, else the wheel's with its Python backend assembled in the
    build folder; with standin, the CPU stand-in for the tensorrtllm backend installed beside it."""
    if not standin and CONTAINER_BINARY.is_file():
        return TritonInstall(CONTAINER_BINARY, CONTAINER_SERVER / "backends")
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError("no tritonserver found: install the nvidia-pytriton wheel (./run does) or use the container")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    libs = root.parent.parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton ships no Python backend stub for Python {version}")
    backend = build_dir / "backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    for src in (
        root / "backends/python/libtriton_python.so",
        root / "backends/python/triton_python_backend_utils.py",
        stub,
    ):
        dst = backend / src.name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            shutil.copy2(src, dst)
    if standin:
        install_standins(backend.parent)
    return TritonInstall(root / "bin" / "tritonserver", backend.parent, (libs,))


def install_standins(backend_dir: Path) -> None:
    """The tensorrtllm backend's stand-in (specdec/triton/standin.py) as a Python-based backend
    of that name: Triton runs <backends>/tensorrtllm/model.py for a model of backend "tensorrtllm"
    when no libtriton_tensorrtllm.so is there."""
    from specdec.build.repository import TEMPLATES

    (backend_dir / "tensorrtllm").mkdir(parents=True, exist_ok=True)
    shutil.copy2(TEMPLATES / "tensorrtllm" / "standin" / "model.py", backend_dir / "tensorrtllm" / "model.py")


def answers(url: str) -> bool:
    """Whether a GET of `url` answers 200."""
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status == 200
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Ports:
    http: int
    grpc: int
    metrics: int
    openai: int = 0  # the OpenAI-compatible frontend's; 0: none

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> Ports:
        return cls(free_port(host), free_port(host), free_port(host), free_port(host))


class TritonServer:
    """A tritonserver serving the profile's rendered repository. Use as a context manager."""

    def __init__(
        self,
        profile: Profile,
        host: str | None = None,
        ports: Ports | None = None,
        log_file: Path | None = None,
        standin: bool = False,
    ):
        """standin: serve a tensorrtllm profile's repository on the CPU, with the stand-ins of
        specdec/triton/standin.py in place of TensorRT-LLM (tests; no GPU needed)."""
        self.profile = profile
        self.standin = standin
        self.supervised = False  # `specdec serve`'s: its state is written for probes (write_state)
        self.frontend: subprocess.Popen | None = None
        self.edge: subprocess.Popen | None = None  # the endpoints clients reach (specdec/triton/edge.py)
        self.internal: InternalAccess | None = None  # tritonserver's own endpoints and this start's key
        self.host = host or profile.server.host
        s = profile.server
        self.ports = ports or Ports(s.http_port, s.grpc_port, s.metrics_port, s.openai_port)
        self.log_file = log_file or profile.build_path() / "logs" / "tritonserver.log"
        self.process: subprocess.Popen | None = None
        self.foreground_log = False
        # the Python backend's shared-memory regions: a killed server leaves them in /dev/shm
        self.shared_memory: set[Path] = set()
        # the Python backend stubs as the server became ready, each with its model
        self.stubs: list[tuple[str, psutil.Process]] = []

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def command(self, install: TritonInstall) -> list[str]:
        repo = self.profile.repository_dir()
        if not (repo / "ensemble" / "config.pbtxt").is_file():
            raise ServerError(f"no model repository at {repo}: run `specdec build` first")
        if self.internal is None:
            self.internal = self._draw_internal()
        return [
            str(install.binary),
            f"--model-repository={repo}",
            f"--backend-directory={install.backend_dir}",
            # behind the edge, which listens on server.host's ports
            f"--http-address={LOOPBACK}",
            f"--http-port={self.internal.http_url.rsplit(':', 1)[1]}",
            f"--grpc-address={LOOPBACK}",
            f"--grpc-port={self.internal.grpc_url.rsplit(':', 1)[1]}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-metrics=true",
            "--model-control-mode=none",  # no model load/unload API
            "--strict-readiness=true",
            "--disable-auto-complete-config",
            "--exit-timeout-secs=15",
            "--log-verbose=0",
            # generation logits of a k-token draft are k * V floats: room for them in shared memory
            "--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=python,shm-growth-byte-size=16777216",
            # server.tls, server.restricted_apis, server.extra_flags, for this tritonserver's version
            *server_flags(self.profile, container=install.binary == CONTAINER_BINARY),
        ]

    def launch(self, install: TritonInstall) -> tuple[list[str], dict[str, str]]:
        """The command line and environment that start the server: tritonserver itself, or for a
        tensorrtllm profile tritonserver under `mpirun` in TensorRT-LLM's orchestrator mode
        (specdec/build/trtllm.py), which only NVIDIA's container has."""
        if self.profile.backend != "tensorrtllm" or self.standin:
            return self.command(install), self.environment(install)
        from specdec.build.trtllm import TRITON_IMAGE, launch_command

        if install.binary != CONTAINER_BINARY:
            needs = f"backend tensorrtllm needs NVIDIA's Triton container ({TRITON_IMAGE})"
            raise ServerError(f"{self.profile.name}: {needs}")
        return launch_command(self.profile, self.command(install), self.environment(install))

    def environment(self, install: TritonInstall) -> dict[str, str]:
        env = dict(os.environ)
        # The Python stub takes its site-packages from the first python3 on PATH.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        libs = [str(p) for p in install.library_dirs]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
        # numba keeps its compiled kernels where it chooses (beside the engine's source, or the
        # user's cache when that is read-only): one compile serves every profile, stub and test.
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.update({name: value for name, value in MALLOC_SETTINGS.items() if name not in os.environ})
        if self.internal is not None:  # the models' key for this start (the stubs inherit it)
            env[KEY_ENV] = self.internal.key
        return env

    def start(self, foreground_log: bool = False) -> TritonServer:
        install = find_triton(self.profile.build_path(), self.standin)
        drain_path(self.profile.build_path()).unlink(missing_ok=True)  # a crash may have left one
        self.foreground_log = foreground_log
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.internal = self._draw_internal()
        write_access_file(access_path(self.profile.build_path(), self.ports.grpc), self.internal)
        argv, env = self.launch(install)
        out = None if foreground_log else open(self.log_file, "wb")  # noqa: SIM115 - closed in stop()
        self._log_handle = out
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,  # its own process group: stop() can reach the stubs too
        )
        self.edge = self._start_edge(out)
        self.frontend = self._start_frontend(out)
        return self

    def _draw_internal(self) -> InternalAccess:
        """tritonserver's own endpoints (free ports of 127.0.0.1) and a key, fresh for a start."""
        return InternalAccess(f"{LOOPBACK}:{free_port(LOOPBACK)}", f"{LOOPBACK}:{free_port(LOOPBACK)}", new_key())

    def _start_edge(self, out) -> subprocess.Popen:
        """The endpoints clients reach (specdec/triton/edge.py) on server.host's HTTP and gRPC
        ports, in front of tritonserver's own; with server.tls, the same TLS on its gRPC endpoint,
        and it reaches tritonserver's as the bundle's clients do. Its output goes to the server's log."""
        assert self.internal is not None
        s = self.profile.server
        argv = [
            sys.executable, "-m", "specdec.triton.edge", f"--http={self.http_url}", f"--grpc={self.grpc_url}",
            f"--triton-http={self.internal.http_url}", f"--triton-grpc={self.internal.grpc_url}",
            f"--max-body-bytes={s.body_limit}",
        ]  # fmt: skip
        if s.tls is not None:
            argv += [f"--tls-cert={s.tls.cert}", f"--tls-key={s.tls.key}"]
            argv += [f"--tls-client-ca={s.tls.client_ca_cert}"] if s.tls.client_ca_cert else []
        argv += frontend_access(s)[0]  # not its headers: a client's own reach tritonserver, to be checked there
        return subprocess.Popen(argv, env={**os.environ, **stream_key(s)}, stdout=out,
                                stderr=subprocess.STDOUT if out else None, start_new_session=True)  # fmt: skip

    @property
    def openai_url(self) -> str | None:
        return f"http://{self.host}:{self.ports.openai}/v1" if self.ports.openai else None

    def _start_frontend(self, out) -> subprocess.Popen | None:
        """The OpenAI-compatible frontend (specdec/openai/server.py) beside tritonserver, its
        output in the server's log."""
        if not self.ports.openai:
            return None
        assert self.internal is not None
        s, engine = self.profile.server, self.profile.engine
        argv = [
            sys.executable, "-m", "specdec.openai.server",
            f"--triton-url={self.internal.grpc_url}", f"--model={self.profile.name}",
            f"--host={self.host}", f"--port={self.ports.openai}",
            f"--max-tokens-limit={min(s.max_tokens_limit, engine.max_seq_len - 1)}",
            f"--max-body-bytes={s.body_limit}",
        ]  # fmt: skip
        if self.supervised:  # its GET /health/ready follows the supervisor's state as well
            argv.append(f"--state-file={state_path(self.profile)}")
        access, env = frontend_access(s)  # TLS and restricted gRPC: its certificates, its headers
        return subprocess.Popen([*argv, *access], env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT if out else None, start_new_session=True)  # fmt: skip

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until the server is ready; ServerError if it exits first or is not ready within
        `timeout` seconds (default: the profile's server.ready_timeout_s)."""
        timeout = self.profile.server.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(f"tritonserver exited with code {self.process.returncode}\n{self.log_tail()}")
            if self.frontend is not None and self.frontend.poll() is not None:
                raise ServerError(f"the OpenAI-compatible frontend exited ({self.frontend.returncode})\n"
                                  f"{self.log_tail()}")  # fmt: skip
            if self.edge is not None and self.edge.poll() is not None:
                raise ServerError(f"the server's edge exited ({self.edge.returncode})\n{self.log_tail()}")
            if answers(url) and (self.openai_url is None or answers(f"{self.openai_url}/models")):
                if self.process is not None:
                    self.shared_memory = mapped_shared_memory(triton_process(self.process.pid))
                    self.stubs = python_stubs(self.process.pid)
                return
            time.sleep(0.5)
        raise ServerError(f"tritonserver not ready after {timeout:.0f}s\n{self.log_tail()}")

    def failure(self) -> str | None:
        """What keeps this started server from serving all its models, or None: tritonserver
        exited, or a model's Python backend stub died since the server became ready. Triton
        2.51 does not start a stub again: its model answers "Stub process ... is not healthy" to
        every request from then on, or (spec_decode's) leaves its streams waiting."""
        if self.process is not None and (code := self.process.poll()) is not None:
            return f"tritonserver exited ({code})"
        if self.frontend is not None and (code := self.frontend.poll()) is not None:
            return f"the OpenAI-compatible frontend exited ({code})"
        if self.edge is not None and (code := self.edge.poll()) is not None:
            return f"the server's edge exited ({code})"
        if dead := sorted({model for model, stub in self.stubs if not alive(stub)}):
            return f"the Python backend stub of {', '.join(dead)} died"
        return None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_file.is_file():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def requests_in_flight(self) -> float | None:
        """spec_decode's running and queued requests; None if metrics do not answer."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as resp:
                text = resp.read().decode("utf-8", errors="replace")
        except OSError:
            return None
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(IN_FLIGHT))

    def drain(self, finish_seconds: float = 10.0, cancel_seconds: float = 5.0) -> None:
        """Before SIGTERM (see specdec/speculation/admission.py): refuse new requests, give in-flight ones
        `finish_seconds` to finish, then stop the rest at their next round."""
        flag = drain_path(self.profile.build_path())
        for state, seconds in ((DRAIN, finish_seconds), (CANCEL, cancel_seconds)):
            flag.write_text(state)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and self.process is not None and self.process.poll() is None:
                if not self.requests_in_flight():  # 0, or no metrics to ask: nothing to wait for
                    return
                time.sleep(0.2)

    def can_finish_requests(self) -> bool:
        """Whether requests in flight can still finish: tritonserver runs and no stub on their
        path died (a dead draft model's requests go on without speculation)."""
        running = self.process is not None and self.process.poll() is None
        return running and {model for model, stub in self.stubs if not alive(stub)} <= {"draft"}

    def stop(self, timeout: float = 30.0, graceful: bool = True) -> None:
        """Drain, then stop tritonserver and everything it started. graceful=False (a server
        whose requests cannot finish, see can_finish_requests): no drain and SIGKILL, so that
        its clients' streams end at once rather than after Triton's exit timeout."""
        if graceful and self.process is not None and self.process.poll() is None:
            if self.supervised:
                write_state(self.profile, DRAINING)
            self.drain()
        for attr in ("frontend", "edge"):  # (after the drain: their streams ended with the requests)
            process = getattr(self, attr)
            setattr(self, attr, None)
            if process is not None:
                terminate(process, timeout=10)
        if self.internal is not None:  # this start's key dies with it
            access_path(self.profile.build_path(), self.ports.grpc).unlink(missing_ok=True)
        proc, self.process = self.process, None
        drain_path(self.profile.build_path()).unlink(missing_ok=True)
        if proc is not None:
            # Every process it started, listed before any exits: a launcher (mpirun) may give
            # tritonserver a process group of its own, and a dead server's stubs are orphans that
            # only this list (and the process group, where they share it) still reaches.
            started = [*descendants(proc.pid), *(stub for _, stub in self.stubs)]
            # SIGTERM only where every model can unload: one whose stub died never does, and
            # tritonserver waits out its exit timeout for it (Server::Stop, core src/server.cc
            # 336-347 at r24.10), with nothing left to finish
            unloads = graceful and all(alive(stub) for _, stub in self.stubs)
            # and its regions now: a server stopped before it was ready has none recorded
            self.shared_memory |= mapped_shared_memory(triton_process(proc.pid))
            if proc.poll() is None:
                # tritonserver itself shuts down gracefully; a launcher need not pass SIGTERM on,
                # and exits once its child has
                with contextlib.suppress(ProcessLookupError):
                    os.kill(triton_process(proc.pid), signal.SIGTERM if unloads else signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=timeout)
            for process in started:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for region in self.shared_memory:  # gone already unless the server died
            region.unlink(missing_ok=True)
        self.shared_memory = set()
        self.stubs = []
        if getattr(self, "_log_handle", None):
            self._log_handle.close()
            self._log_handle = None

    def restart(self, graceful: bool = True) -> Path | None:
        """Stop what is left of the server (its stubs, its shared memory; `graceful` as stop()'s),
        start it again and wait until it is ready. The old log is kept under a dated name,
        returned (None: the log went to the terminal)."""
        self.stop(graceful=graceful)
        kept = None
        if not self.foreground_log and self.log_file.is_file():
            stamp = time.strftime("%Y%m%d-%H%M%S")
            kept = self.log_file.rename(self.log_file.with_name(f"{self.log_file.stem}-{stamp}{self.log_file.suffix}"))
        self.start(foreground_log=self.foreground_log)
        self.wait_ready()
        return kept

    def __enter__(self) -> TritonServer:
        if self.process is None:
            self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def mapped_shared_memory(pid: int) -> set[Path]:
    """The files of /dev/shm that process `pid` has mapped."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # gone, or not Linux
        return set()
    return {Path(p) for line in maps.splitlines() if (p := line.split(maxsplit=5)[-1]).startswith("/dev/shm/")}


def descendants(pid: int) -> list[psutil.Process]:
    """The processes `pid` started, and theirs ([] once it is gone)."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def triton_process(pid: int) -> int:
    """The tritonserver process: `pid` itself, or the first of its descendants (under mpirun)."""
    with contextlib.suppress(psutil.Error):
        for process in (psutil.Process(pid), *descendants(pid)):
            with contextlib.suppress(psutil.Error):
                if process.name() == "tritonserver":
                    return process.pid
    return pid


def python_stubs(pid: int) -> list[tuple[str, psutil.Process]]:
    """The Python backend stubs under tritonserver `pid` (or under the mpirun that started it),
    each with its model (a stub's command line names the model's
    <repository>/<model>/<version>/model.py)."""
    stubs = []
    for child in descendants(pid):
        with contextlib.suppress(psutil.Error):
            command = child.cmdline()
            if command and Path(command[0]).name == "triton_python_backend_stub":
                model_py = next(a for a in command if a.endswith("model.py"))
                stubs.append((Path(model_py).parent.parent.name, child))
    return stubs


def alive(process: psutil.Process) -> bool:
    """Whether `process` runs (not gone, not a zombie its parent has yet to reap)."""
    with contextlib.suppress(psutil.Error):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


STUB_POLL_S = 1.0  # how often supervise looks for a dead stub
STATE_FILE = "serve-state.json"  # in the build folder: what `specdec serve` is doing, for probes
STARTING, READY, RESTARTING, DRAINING, STOPPED, FAILED = (
    "starting",
    "ready",
    "restarting",
    "draining",
    "stopped",
    "failed",
)
# Liveness: `specdec serve` rewrites its state at least this often while it supervises.
HEARTBEAT_S = 5.0


def state_path(profile: Profile) -> Path:
    return profile.build_path() / STATE_FILE


def write_state(profile: Profile, state: str) -> None:
    """Record `specdec serve`'s state (with the time, its heartbeat), atomically."""
    path = state_path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps({"state": state, "time": time.time(), "pid": os.getpid()}))
    os.replace(staged, path)


def read_state(profile: Profile) -> tuple[str, float]:
    """(state, seconds since it was written); ("", inf) where there is none."""
    try:
        data = json.loads(state_path(profile).read_text())
    except (OSError, ValueError):
        return "", math.inf
    return str(data.get("state", "")), time.time() - float(data.get("time", 0.0))


def _wait_for_failure(server: TritonServer) -> str:
    """Block until the server can no longer serve all its models (TritonServer.failure),
    renewing the ready state's heartbeat."""
    assert server.process is not None
    beat = time.monotonic()
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=STUB_POLL_S)
        if failure := server.failure():
            return failure
        if time.monotonic() - beat >= HEARTBEAT_S:
            write_state(server.profile, READY)
            beat = time.monotonic()


def supervise(server: TritonServer, say: Callable[[str], None]) -> int:
    """Wait on a ready server and start it again each time it dies or one of its models' Python
    stubs dies, at most `max_restarts` times within `restart_window_s` (server options). Returns
    only when it gives up: 1. A stop (SIGTERM, Ctrl-C) reaches the caller as KeyboardInterrupt.
    Its state goes to the build folder's STATE_FILE (ready, restarting, failed; stop() writes
    draining), renewed every HEARTBEAT_S, for readiness and liveness probes (docker/healthcheck.py).

    A restart starts clean (TritonServer.restart): a server whose requests can still finish (only
    the draft model's stub died) is drained first, one whose requests cannot is killed at once, so
    that its streams end now rather than hang until Triton's exit timeout; the
    old server's stubs are killed with its process group, its shared memory is unlinked, its log
    is kept under a dated name. Requests it was serving fail (clients see UNAVAILABLE); the new
    server serves from its first ready."""
    options = server.profile.server
    restarts: deque[float] = deque()  # when each happened
    while True:
        write_state(server.profile, READY)
        failure = _wait_for_failure(server)
        write_state(server.profile, RESTARTING)
        say(f"[red]{failure}[/]\n{server.log_tail()}")
        now = time.monotonic()
        while restarts and now - restarts[0] > options.restart_window_s:
            restarts.popleft()
        if len(restarts) >= options.max_restarts:
            say(
                f"[red]not restarting[/]: {len(restarts)} restart(s) in the last {options.restart_window_s:.0f} s "
                f"(server.max_restarts {options.max_restarts})"
            )
            write_state(server.profile, FAILED)
            return 1
        restarts.append(now)
        say(f"restarting tritonserver ({len(restarts)} of {options.max_restarts} in {options.restart_window_s:.0f} s)")
        try:
            kept = server.restart(graceful=server.can_finish_requests())
        except ServerError as err:
            say(f"[red]the restarted tritonserver did not become ready[/]: {err}")
            write_state(server.profile, FAILED)
            return 1
        say(f"[green]ready again[/]  gRPC {server.grpc_url}  HTTP {server.http_url}"
            + (f"   the old server's log: {kept}" if kept else ""))  # fmt: skip


@contextlib.contextmanager
def embedded_server(profile: Profile, url: str | None = None, build_first: bool = True):
    """Yield (grpc_url, http_url, server or None): the given server, or else a server for the
    profile started for the duration of the block (on free ports, so it never collides with a
    server already running)."""
    if url:
        yield url, None, None
        return
    from specdec.build import build
    from specdec.progress import console

    if build_first:
        build(profile)
    server = TritonServer(profile, ports=Ports.free(profile.server.host))
    with console.status("starting tritonserver (models load and warm up)..."):
        server.start()
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
    try:
        yield server.grpc_url, server.http_url, server
    finally:
        server.stop()
