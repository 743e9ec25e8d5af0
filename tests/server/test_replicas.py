"""`specdec replicas`: two replicas of the embedded model behind Debian's haproxy, as real
processes (the command, each replica's `specdec serve` with its tritonserver and frontends,
haproxy). Requests over Triton's HTTP and gRPC APIs and the OpenAI API are spread over both
replicas; one replica's tritonserver killed in the middle of a bench fails only the requests in
flight on it, each with an error and within seconds, haproxy marks it down within seconds and
every request sent after that succeeds; Ctrl-C stops everything. Two replicas share this
machine's 2 cores: no throughput is claimed. About 2-3 minutes, most of it the replicas' start."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest
import yaml
from support.servers import wait_for

from specdec.client.client import RequestParams, TritonClient, http_generate
from specdec.client.failover import DOWN_WITHIN_S, FAIL_WITHIN_S, run_failover
from specdec.client.server_stats import scrape, total
from specdec.config import REPO_ROOT, load_profile
from specdec.triton.replicas import BalancerPorts, ClusterInfo, replicas_root, show_stat

pytestmark = pytest.mark.server

NAME = "replicas-test"
START_S = 600  # both replicas load their models at once, on 2 cores
REQUESTS = 24
# a stream cut off: haproxy ends it without gRPC's trailers ("Stream removed"), or the server's edge
# answers for a tritonserver it can no longer reach
GRPC_BROKEN = {"gRPC UNKNOWN", "gRPC UNAVAILABLE", "gRPC INTERNAL", "gRPC CANCELLED"}


def profile_file(embedded_profile, directory):
    """The embedded profile under a name of its own, its weights (converted once, for the whole
    session) used in place."""
    data = embedded_profile.model_dump(mode="json")
    data.update(
        name=NAME,
        build_dir=None,
        target={"hf_dir": str(embedded_profile.model_dir("target"))},
        draft={"hf_dir": str(embedded_profile.model_dir("draft"))},
    )
    path = directory / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def ours(process: psutil.Process, marks: list[str]) -> bool:
    """Whether a process belongs to this test's cluster: its command line names the cluster's
    build folder or one of its replicas' addresses."""
    with contextlib.suppress(psutil.Error):
        command = " ".join(process.cmdline())
        return any(mark in command for mark in marks)
    return False


def alive(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def leftovers(marks: list[str]) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if ours(p, marks) and alive(p)]


@pytest.fixture(scope="module")
def cluster(embedded_profile, tmp_path_factory):
    """`specdec replicas` of the test profile on free ports, as a user runs it (in a session of
    its own, as a terminal's foreground job would be); yields (its process, the ClusterInfo it
    wrote when ready, its profile). Whatever is left of it afterwards is killed, by process id."""
    directory = tmp_path_factory.mktemp("replicas")
    path = profile_file(embedded_profile, directory)
    profile = load_profile(path)
    root = replicas_root(profile)
    (root / "cluster.json").unlink(missing_ok=True)
    ports = BalancerPorts.free()
    log = directory / "replicas.log"
    argv = [sys.executable, "-m", "specdec.cli", "replicas", f"--profile={path}", f"--http-port={ports.http}",
            f"--grpc-port={ports.grpc}", f"--openai-port={ports.openai}", f"--stats-port={ports.stats}"]  # fmt: skip
    marks = [str(root), str(profile.build_path() / "model_repository")]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True)
    try:
        ready = wait_for(lambda: (root / "cluster.json").is_file() or process.poll() is not None, timeout=START_S)
        assert ready and process.poll() is None, f"`specdec replicas` did not get ready:\n{log.read_text()[-4000:]}"
        info = ClusterInfo.read(root / "cluster.json")
        marks += [f"127.0.0.1:{port}" for r in info.replicas for port in (r.ports.http, r.ports.grpc)]
        marks += [f"--port={r.ports.openai}" for r in info.replicas]
        yield process, info, profile
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=90)
        if process.poll() is None:
            process.kill()
            process.wait()
        for left in leftovers(marks):
            with contextlib.suppress(psutil.Error):
                left.kill()


def finished(replica) -> float:
    samples = scrape(replica.metrics_url, timeout=5)
    assert samples is not None, f"{replica.name}'s metrics do not answer"
    return total(samples, "specdec_requests_total")


def balancer_sessions(info: ClusterInfo, backend: str) -> dict[str, int]:
    return {r["svname"]: int(r["stot"]) for r in show_stat(info.stats_socket)
            if r["pxname"] == backend and r["svname"].startswith("r")}  # fmt: skip


def test_requests_over_every_api_are_spread_over_both_replicas(cluster):
    _, info, profile = cluster
    assert info.states() == {"r0": "UP", "r1": "UP"}
    before = {r.name: finished(r) for r in info.replicas}
    grpc_before = balancer_sessions(info, "triton_grpc")
    params = RequestParams(max_tokens=8)

    async def main():
        async with TritonClient(info.grpc_url) as client:
            gate = asyncio.Semaphore(4)

            async def one(i: int):
                async with gate:
                    return await client.generate(f"Name a fruit, number {i}.", params, stream=i % 2 == 0)

            return await asyncio.gather(*(one(i) for i in range(8)))

    records = asyncio.run(main())
    assert [r.error for r in records] == [None] * 8 and all(r.num_output_tokens > 0 for r in records)
    http = asyncio.run(http_generate(info.http_url, "Name a colour.", params))
    assert http.error is None and http.num_output_tokens > 0
    body = {"model": profile.name, "messages": [{"role": "user", "content": "Name a tree."}], "max_tokens": 8}
    request = urllib.request.Request(f"{info.openai_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert json.loads(resp.read())["choices"][0]["message"]["content"]

    after = {r.name: finished(r) for r in info.replicas}
    served = {name: after[name] - before[name] for name in after}
    assert sum(served.values()) == 10 and all(n > 0 for n in served.values()), served
    grpc_sessions = balancer_sessions(info, "triton_grpc")
    assert all(grpc_sessions[name] > grpc_before[name] for name in grpc_sessions), (grpc_before, grpc_sessions)


def test_a_replica_killed_mid_bench_fails_only_its_requests_in_flight(cluster, tmp_path):
    """run_failover is `specdec replicas --failover-demo`'s: a bench through the balancer's gRPC
    port, r1's tritonserver killed (SIGKILL) while it has requests in flight. Watched here too,
    through haproxy's stats socket."""
    _, info, profile = cluster
    seen: list[tuple[float, dict[str, str]]] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append((time.perf_counter(), info.states()))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        report = run_failover(info, profile, tmp_path, requests=REQUESTS, concurrency=4, max_tokens=32)
    finally:
        stop.set()
        watcher.join()
    assert report.passed, report.problems
    assert report.victim == "r1" and all(n > 0 for n in report.served_before_kill.values())

    bench = json.loads((tmp_path / "bench.json").read_text())
    (level,) = bench["levels"]
    requests = level["requests"]
    kill, down = report.kill_s, report.down_s
    assert kill is not None and down is not None
    # the requests in flight on r1 failed, each with its error, within seconds of the kill: none
    # hung; so may those sent in the second before haproxy knew, at once (UNAVAILABLE)
    failed = [r for r in requests if r["error"]]
    in_flight = [r for r in failed if r["start"] < kill]
    assert 1 <= len(in_flight) <= report.victim_in_flight + 1, (failed, report.victim_in_flight)
    assert len(in_flight) == report.failed_in_flight
    assert len(failed) == len(in_flight) + report.failed_before_down
    assert bench["failures"]["failed"] == len(failed) == len(report.failed)
    assert set(bench["failures"]["by_reason"]) <= GRPC_BROKEN, bench["failures"]
    for r in failed:
        assert r["start"] < down and kill <= r["end"] <= kill + FAIL_WITHIN_S, r
        assert r["error"].strip()
        if r["start"] >= kill:
            assert r["end"] - r["start"] < 2.0, r
    # haproxy had r1 down within seconds (its own clock of it, read here)
    kill_clock = report.clock_t0 + kill
    down_seen = next(t for t, states in seen if t > kill_clock and states["r1"] == "DOWN")
    assert down_seen - kill_clock < DOWN_WITHIN_S / 2
    assert all(states["r0"] == "UP" for _, states in seen)  # the other never left
    # every request sent after that succeeded, and the bench went on to its end
    later = [r for r in requests if r["start"] >= down]
    assert len(later) >= 4 and all(r["error"] is None and r["num_output_tokens"] > 0 for r in later)
    assert bench["failures"]["requests"] == REQUESTS
    summary = (tmp_path / "summary.md").read_text()
    assert f"**{len(failed)} of {REQUESTS} requests failed**" in summary


def test_ctrl_c_stops_the_balancer_and_every_replica(cluster):
    process, info, profile = cluster
    everything = [psutil.Process(info.balancer_pid)]
    for r in info.replicas:
        everything += [psutil.Process(r.pid), *psutil.Process(r.pid).children(recursive=True)]
    names = {p.name() for p in everything}
    assert {"haproxy", "tritonserver", "triton_python_backend_stub"} <= names, names
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=90) == 0
    assert wait_for(lambda: not any(alive(p) for p in everything), 10), [p for p in everything if alive(p)]
    for r in info.replicas:
        state = json.loads((replicas_root(profile) / r.name / "serve-state.json").read_text())["state"]
        assert state == "stopped"
    assert not (replicas_root(profile) / "cluster.json").exists()
    for port in (info.ports.grpc, info.ports.http, info.ports.openai):
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://{info.host}:{port}/", timeout=2)
