"""What production throws at the server: cancellations, a failing draft, overload, an engine,
a BLS stub or tritonserver dying under streams, SIGTERM under load (random and hostile input:
test_fuzz.py). Every test runs against a real tritonserver on 127.0.0.1 and is bounded in
requests and time."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import psutil
import pytest
from support.servers import internal_client, variant_profile, variant_server, wait_for

from specdec.client.client import RequestParams, TritonClient
from specdec.client.server_stats import resident_by_name, scrape, server_processes, total
from specdec.config import REPO_ROOT, ServerOptions

pytestmark = pytest.mark.server


def counter(server, name: str, **labels) -> float:
    samples = scrape(server.metrics_url)
    assert samples is not None
    return total(samples, name, **labels)


def server_memory(server) -> dict[str, int]:
    """Resident bytes of each of the server's processes: tritonserver, each model's Python stub,
    the edge and the OpenAI-compatible frontend."""
    roots = {"tritonserver": server.process.pid, "edge": server.edge.pid, "openai": server.frontend.pid}
    return {name: memory.rss for name, memory in resident_by_name(server_processes(roots)).items()}


# --- cancellation ----------------------------------------------------------------------------------
LONG = "Count from 1 to 500, one number per line."


def test_a_cancelled_stream_stops_its_loop_and_frees_its_cache(server):
    before = counter(server, "specdec_requests_total", reason="cancelled")

    async def main():
        async with TritonClient(server.grpc_url) as client:
            return await client.generate(LONG, RequestParams(max_tokens=400), cancel_after=2)

    record = asyncio.run(main())
    assert len(record.chunks) == 2
    # the loop notices within a round (a few tens of ms here); generating to the end would take ~10 s
    assert wait_for(lambda: counter(server, "specdec_requests_total", reason="cancelled") == before + 1, timeout=3)
    assert wait_for(lambda: counter(server, "specdec_kv_slots_in_use") == 0, timeout=3)


# What 200 cancellations may add to any one process's resident memory: 200 requests at the soak's
# bound (benchmarks/soak.py, MAX_SLOPE_BYTES a request) plus the pages a warm-up of 16 leaves to
# touch. This test measured at most 0.53 MiB (tritonserver; its stubs, the edge and the frontend
# less) with tritonserver's malloc settings (specdec/triton/serve.py MALLOC_SETTINGS); 5% of the
# whole server, the bound before them, was about 130 MiB.
CANCELLATIONS_GROWTH_BYTES = 2 << 20


def test_hundreds_of_cancellations_leave_memory_and_cache_where_they_were(server, tokenizer):
    """200 requests cancelled mid-stream (8 at a time, half through the ensemble, half token
    level through spec_decode); no process's resident memory grows by CANCELLATIONS_GROWTH_BYTES."""

    async def cancel_many(n: int):
        gate = asyncio.Semaphore(8)
        ids = tokenizer.encode(tokenizer.chat_prompt(LONG))
        async with TritonClient(server.grpc_url) as client, internal_client(server) as direct:

            async def one(i: int):
                async with gate:
                    params = RequestParams(max_tokens=300, num_draft_tokens=i % 6)
                    if i % 2:
                        return await client.generate(LONG, params, cancel_after=1 + i % 3)
                    return await direct.generate_ids(ids, params, cancel_after=1 + i % 3)

            return await asyncio.gather(*(one(i) for i in range(n)))

    asyncio.run(cancel_many(16))  # warm-up: allocator pools, caches
    assert wait_for(lambda: counter(server, "specdec_kv_slots_in_use") == 0, timeout=10)
    before = server_memory(server)
    cancelled_before = counter(server, "specdec_requests_total", reason="cancelled")
    records = asyncio.run(cancel_many(200))
    assert all(r.error is None for r in records), [r.error for r in records if r.error][:3]
    assert wait_for(lambda: counter(server, "specdec_kv_slots_in_use") == 0, timeout=10)
    assert counter(server, "specdec_requests_total", reason="cancelled") - cancelled_before >= 190
    grown = {name: rss - before[name] for name, rss in server_memory(server).items()}
    assert all(growth < CANCELLATIONS_GROWTH_BYTES for growth in grown.values()), f"bytes grown: {grown}"


def test_a_dropped_http_stream_is_bounded_by_max_tokens(server):
    """Triton 2.51 does not cancel an HTTP request whose client disconnects: the request runs on
    to max_tokens (here 48) and then frees its cache; nothing is leaked."""
    import socket

    body = json.dumps({"text_input": LONG, "max_tokens": 48, "stream": True}).encode()
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/ensemble/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while b"data:" not in received:  # the headers and the first event may arrive apart
            chunk = sock.recv(4096)
            assert chunk, f"the server closed the stream before its first event: {received!r}"
            received += chunk
        # streaming has begun; now hang up
    assert wait_for(lambda: counter(server, "specdec_kv_slots_in_use") == 0, timeout=30)


# --- overload ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bounded(embedded_profile, smollm_dir):
    """A server of 2 requests in flight and 2 queued; the failing-draft test, which kills its draft
    model, is the last to use it."""
    server_options = ServerOptions(max_inflight=2, max_queue=2)
    with variant_server(embedded_profile, smollm_dir, "reliability-bounded", server=server_options) as srv:
        yield srv


def test_overload_queues_up_to_the_bound_then_refuses_at_once(bounded, tokenizer):
    ids = tokenizer.encode(tokenizer.chat_prompt("Say hello."))

    async def flood():
        async with internal_client(bounded) as client:
            params = RequestParams(max_tokens=16, num_draft_tokens=0)
            return await asyncio.wait_for(
                asyncio.gather(*(client.generate_ids(ids, params) for _ in range(12))), timeout=120
            )

    records = asyncio.run(flood())
    refused = [r for r in records if r.error]
    served = [r for r in records if not r.error]
    assert len(served) >= 4 and refused, [r.error for r in records]
    assert all("server busy" in r.error for r in refused)
    assert all(r.end - r.start < 2.0 for r in refused)  # refused at once, not after waiting
    assert len({tuple(r.ids) for r in served}) == 1  # every admitted request completed correctly


# --- a failing draft -----------------------------------------------------------------------------------
def test_requests_survive_a_failing_draft_model(bounded, tokenizer):
    """Kill the draft model's backend process: draft_model requests fall back to plain decoding,
    with the same greedy tokens, a warning in the log and a counter in the metrics."""
    ids = tokenizer.encode(tokenizer.chat_prompt("List three colors."))
    params = RequestParams(max_tokens=24, draft_method="draft_model", num_draft_tokens=3)

    async def run(**kw):
        async with internal_client(bounded) as client:
            return await client.generate_ids(ids, RequestParams(**{**vars(params), **kw}))

    reference = asyncio.run(run(num_draft_tokens=0, draft_method="none"))
    stubs = [
        p
        for p in psutil.Process(bounded.process.pid).children(recursive=True)
        if "/draft/1/model.py" in " ".join(p.cmdline())
    ]
    assert stubs, "the draft model's stub process was not found"
    for stub in stubs:
        stub.kill()
    records = [asyncio.run(run()) for _ in range(3)]
    assert [r.error for r in records] == [None] * 3
    assert all(r.ids == reference.ids for r in records)
    assert counter(bounded, "specdec_proposer_fallbacks_total", proposer="draft_model") >= 1
    assert "continues without speculation" in Path(bounded.log_file).read_text(errors="replace")


# --- a dead server, shutdown -------------------------------------------------------------------------
def test_a_server_stopped_while_it_loads_leaves_no_shared_memory(embedded_profile, smollm_dir):
    """Stopped before it is ready (a supervisor stopped during a restart), with its Python stubs
    started: nothing of it is left, neither a process nor a shared-memory region."""
    from specdec.triton.serve import Ports, TritonServer, alive, answers, mapped_shared_memory, triton_process

    server = TritonServer(variant_profile(embedded_profile, smollm_dir, "reliability-early-stop"), ports=Ports.free())
    server.start()
    try:
        pid = triton_process(server.process.pid)
        assert wait_for(lambda: len(mapped_shared_memory(pid)) >= 3, timeout=60), "no stub started"
        regions = mapped_shared_memory(pid)
        started = psutil.Process(pid).children(recursive=True)
        assert not answers(f"http://{server.http_url}/v2/health/ready")  # still loading
    finally:
        server.stop()
    assert wait_for(lambda: not any(alive(p) for p in started), timeout=10)
    assert not [r for r in regions if r.exists()]


FAULT_BOUND_S = 20.0  # a stream on a server that breaks ends within this (the supervisor polls every second)


def test_specdec_serve_recovers_from_each_engine_fault_and_drains_on_sigterm(embedded_profile, smollm_dir, tmp_path):
    """`specdec serve` as a user runs it, with 3 streams in flight at each fault: the target
    engine's stub killed, spec_decode's stub killed, tritonserver killed. Each time every open
    stream ends with an error within FAULT_BOUND_S (none hangs), readiness turns false until
    serve has a new server ready, the old server's stubs and shared memory are gone (its log
    kept), and the new server's greedy output is the first one's. Then SIGTERM while 6 streams
    generate: they finish (or stop with UNAVAILABLE) within the drain bound, the server exits 0,
    and no stub process or shared memory segment is left."""
    import subprocess
    import sys

    import yaml

    from specdec.triton.serve import alive, free_port, mapped_shared_memory, python_stubs

    profile = variant_profile(embedded_profile, smollm_dir, "reliability-faults")
    profile_file = tmp_path / "profile.yaml"
    profile_file.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    for old_log in (profile.build_path() / "logs").glob("tritonserver-*.log"):
        old_log.unlink()
    ports = [free_port() for _ in range(4)]
    grpc_url = f"127.0.0.1:{ports[1]}"
    shm_before = set(os.listdir("/dev/shm"))
    said = tmp_path / "serve.err"  # what serve says (its console is stderr)

    def probe(kind: str) -> int:
        env = {**os.environ, "SPECDEC_PROFILE": str(profile_file), "SPECDEC_HTTP_PORT": str(ports[0])}
        return subprocess.run([sys.executable, str(REPO_ROOT / "docker" / "healthcheck.py"), kind], env=env).returncode

    async def greedy():
        async with TritonClient(grpc_url) as client:
            return await client.generate("Name three rivers.", RequestParams(max_tokens=16, temperature=0.0))

    async def streams_through(fault) -> tuple[list[str | None], list[int], float]:
        """3 streams; once each has a chunk, fault(); each one's error, its chunks, and how long
        after the fault the last of them ended. A stream ends with an error response, or with its
        connection (the edge is restarted with the server: gRPC UNAVAILABLE)."""
        chunks = [0, 0, 0]
        ends: list[float] = []

        async def one(client: TritonClient, i: int) -> str | None:
            def counted(_: str) -> None:
                chunks[i] += 1

            try:
                error = (await client.generate(LONG, RequestParams(max_tokens=400), on_chunk=counted)).error
            except grpc.RpcError as err:
                error = f"{err.code().name}: {err.details()}"
            ends.append(time.perf_counter())
            return error

        async with TritonClient(grpc_url) as client:
            tasks = [asyncio.create_task(one(client, i)) for i in range(3)]
            while not all(chunks):
                await asyncio.sleep(0.05)
            faulted = time.perf_counter()
            fault()
            errors = await asyncio.wait_for(asyncio.gather(*tasks), timeout=FAULT_BOUND_S + 30)
        return errors, chunks, max(ends) - faulted

    with said.open("w") as err:
        serve = subprocess.Popen(
            [sys.executable, "-m", "specdec.cli", "serve", "--profile", str(profile_file), "--no-build",
             "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
             "--openai-port", str(ports[3])],
            stderr=err, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
    try:
        # serve's own word, not Triton's health endpoint: a server dying before serve saw it ready
        # is a start that failed (serve exits), not a crash to restart
        assert wait_for(lambda: "ready  gRPC" in said.read_text(), timeout=120), "specdec serve did not become ready"
        assert wait_for(lambda: probe("--ready") == probe("--live") == 0, timeout=10)  # the probes agree
        reference = asyncio.run(greedy())
        assert reference.error is None and reference.text

        faults = {
            "target": lambda pid: next(stub for model, stub in python_stubs(pid) if model == "target").kill(),
            "spec_decode": lambda pid: next(stub for model, stub in python_stubs(pid) if model == "spec_decode").kill(),
            "tritonserver": lambda pid: os.kill(pid, signal.SIGKILL),
        }
        for restarts, (name, fault) in enumerate(faults.items(), start=1):
            server_pid = _tritonserver_of(serve.pid)
            old_stubs = psutil.Process(server_pid).children(recursive=True)
            old_regions = mapped_shared_memory(server_pid)
            errors, chunks, ended_after = asyncio.run(streams_through(functools.partial(fault, server_pid)))
            assert all(chunks) and all(errors), (name, errors)
            assert ended_after < FAULT_BOUND_S, f"{name}: the streams ended {ended_after:.1f} s after the fault"
            # (a restart takes far longer than the streams took to end: it is under way)
            assert probe("--ready") == 1 and probe("--live") == 0, name  # Triton may still answer ready
            restarted = functools.partial(lambda n: said.read_text().count("ready again") == n, restarts)
            assert wait_for(restarted, timeout=180), (name, said.read_text()[-2000:])
            assert wait_for(lambda: probe("--ready") == 0, timeout=10), name
            assert not any(alive(p) for p in old_stubs), name
            assert not any(region.exists() for region in old_regions), name
            again = asyncio.run(greedy())
            assert again.error is None and again.text == reference.text, name
        assert "the Python backend stub of spec_decode died" in said.read_text()
        kept_logs = list((profile.build_path() / "logs").glob("tritonserver-*.log"))
        assert len(kept_logs) == len(faults)

        server_pid = _tritonserver_of(serve.pid)
        stubs = psutil.Process(server_pid).children(recursive=True)

        async def load():
            async with TritonClient(grpc_url) as client:
                params = RequestParams(max_tokens=200)
                tasks = [asyncio.create_task(client.generate(LONG, params)) for _ in range(6)]
                await asyncio.sleep(1.5)
                serve.send_signal(signal.SIGTERM)
                return await asyncio.wait_for(asyncio.gather(*tasks), timeout=40)

        started = time.monotonic()
        records = asyncio.run(load())
        assert serve.wait(timeout=40) == 0
        elapsed = time.monotonic() - started
    finally:  # a failed test leaves no server behind: tritonserver has a process group of its own
        if serve.poll() is None:
            serve.terminate()  # serve drains and stops its tritonserver
            try:
                serve.wait(timeout=45)
            except subprocess.TimeoutExpired:
                if (left := _tritonserver_of(serve.pid)) is not None:
                    os.killpg(os.getpgid(left), signal.SIGKILL)
                serve.kill()
                serve.wait()
    assert elapsed < 35, f"shutdown took {elapsed:.0f} s"
    assert probe("--ready") == probe("--live") == 1  # stopped
    assert all(r.chunks for r in records)  # every stream had started
    assert all(r.error is None or "shutting down" in r.error for r in records), [r.error for r in records]
    assert wait_for(lambda: not any(alive(p) for p in stubs), timeout=10)
    leftover = {f for f in set(os.listdir("/dev/shm")) - shm_before if "triton" in f}
    assert not leftover, f"shared memory left behind: {leftover}"


class _DyingServer:
    """Stands in for TritonServer in supervise(): each start runs a process that lives
    `lifetime` seconds; the start after `stop_after` starts is a SIGTERM."""

    grpc_url = http_url = "-"
    foreground_log = False

    def __init__(self, max_restarts: int, window_s: float, lifetime: float, stop_after: int = 1000):
        from specdec.config import load_profile

        profile = load_profile()
        options = profile.server.model_copy(update={"max_restarts": max_restarts, "restart_window_s": window_s})
        self.profile = profile.model_copy(update={"server": options})
        self.lifetime, self.stop_after, self.starts = lifetime, stop_after, 0
        self.process = None
        self.start()

    def start(self, foreground_log: bool = False) -> None:
        import subprocess
        import sys

        if self.starts == self.stop_after:
            raise KeyboardInterrupt
        self.starts += 1
        self.process = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({self.lifetime})"])

    def can_finish_requests(self) -> bool:
        return self.process.poll() is None

    def restart(self, graceful: bool = True) -> None:
        self.start()

    def failure(self) -> str | None:
        return None if self.process.poll() is None else "exited"

    def log_tail(self) -> str:
        return ""


def test_supervise_gives_up_after_max_restarts_within_the_window():
    from specdec.triton.serve import supervise

    said: list[str] = []
    server = _DyingServer(max_restarts=2, window_s=3600, lifetime=0)
    assert supervise(server, said.append) == 1
    assert server.starts == 3
    assert "not restarting" in said[-1] and "server.max_restarts 2" in said[-1]


def test_supervise_forgets_restarts_older_than_the_window():
    from specdec.triton.serve import supervise

    server = _DyingServer(max_restarts=1, window_s=0.2, lifetime=0.4, stop_after=4)
    with pytest.raises(KeyboardInterrupt):
        supervise(server, lambda _: None)
    assert server.starts == 4


def _tritonserver_of(pid: int) -> int | None:
    return next((c.pid for c in psutil.Process(pid).children() if "tritonserver" in c.name()), None)


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
