"""specdec/triton/replicas.py without a tritonserver: each replica's profile, and a real haproxy
with the rendered configuration in front of stand-in readiness endpoints, read through its stats
socket (tests/server/test_replicas.py runs real replicas)."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest

from specdec.config import ProfileError, load_profile
from specdec.triton.replicas import (
    Balancer,
    BalancerPorts,
    ClusterInfo,
    ReplicaInfo,
    replica_profile,
    replicas_root,
    server_states,
    show_stat,
)
from specdec.triton.serve import Ports, ServerError, free_port


def test_a_replica_serves_the_base_weights_from_a_build_folder_of_its_own():
    base = load_profile()
    replicas = [replica_profile(base, i, 2) for i in range(2)]
    assert {r.name for r in replicas} == {base.name}  # the model clients name
    assert [r.build_path() for r in replicas] == [replicas_root(base) / "r0", replicas_root(base) / "r1"]
    assert replicas_root(base).parent == base.build_path()
    for r in replicas:
        for role in ("target", "draft"):
            assert r.model_dir(role) == base.model_dir(role)  # in place: nothing converted again
        assert r.engine.threads is not None and r.engine.threads >= 1  # the cores shared out
        assert r.speculation == base.speculation and r.server == base.server


def test_a_profile_that_sets_its_threads_keeps_them():
    base = load_profile()
    base = base.model_copy(update={"engine": base.engine.model_copy(update={"threads": 3})})
    assert replica_profile(base, 0, 2).engine.threads == 3


def test_tensorrtllm_profiles_have_no_local_replicas():
    gpu = load_profile(Path(__file__).resolve().parents[3] / "configs" / "llama3.1-8b-eagle3.yaml")
    with pytest.raises(ProfileError, match="PyTorch-engine"):
        replica_profile(gpu, 0, 2)


def test_the_cluster_description_reads_back(tmp_path):
    info = ClusterInfo("127.0.0.1", BalancerPorts(1, 2, 3, 4), "/tmp/s.sock", 42, "2.6.12",
                       [ReplicaInfo("r0", Ports(5, 6, 7, 8), "/b/r0", 43, "/b/r0/logs/serve.log")])  # fmt: skip
    info.write(tmp_path / "cluster.json")
    back = ClusterInfo.read(tmp_path / "cluster.json")
    assert back == info
    assert back.grpc_url == "127.0.0.1:2" and back.openai_url == "http://127.0.0.1:3/v1"
    assert back.replicas[0].metrics_url == "http://127.0.0.1:7/metrics"


class Readiness(http.server.BaseHTTPRequestHandler):
    """A replica's GET /health/ready, answering what `ready` says."""

    ready = True

    def do_GET(self):
        status = 200 if self.path == "/health/ready" and self.ready else 503
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def endpoint(ready: bool) -> tuple[http.server.HTTPServer, type[Readiness]]:
    handler = type("Handler", (Readiness,), {"ready": ready})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


def wait_states(socket: Path, want: dict[tuple[str, str], str], timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = server_states(socket)
        if all(states.get(k) == v for k, v in want.items()):
            return states
        time.sleep(0.1)
    return server_states(socket)


def test_haproxy_follows_each_replicas_readiness_in_every_backend(tmp_path):
    """One replica ready, one answering 503: the first UP, the second DOWN, in the checked
    backend and in both that track it; then the second becomes ready, and the first does not."""
    (up, up_handler), (down, down_handler) = endpoint(True), endpoint(False)
    replicas = [Ports(free_port(), free_port(), free_port(), s.server_address[1]) for s in (up, down)]
    balancer = Balancer(tmp_path)
    try:
        balancer.write_config(replicas, "127.0.0.1", BalancerPorts.free())
        balancer.start()
        started = time.monotonic()
        want = {(b, "r0"): "UP" for b in ("openai", "triton_http", "triton_grpc")}
        want |= {(b, "r1"): "DOWN" for b in ("openai", "triton_http", "triton_grpc")}
        assert wait_states(balancer.stats_socket, want) == want
        assert time.monotonic() - started < 5  # two failed checks, half a second apart
        rows = {(r["pxname"], r["svname"]): r for r in show_stat(balancer.stats_socket)}
        assert rows[("openai", "r1")]["check_status"] == "L7STS"  # a 503, not a refused connection
        down_handler.ready, up_handler.ready = True, False
        flipped = {k: ("DOWN" if k[1] == "r0" else "UP") for k in want}
        assert wait_states(balancer.stats_socket, flipped) == flipped
    finally:
        balancer.stop()
        up.shutdown()
        down.shutdown()
    assert balancer.process is None and not balancer.stats_socket.exists()


def test_a_config_haproxy_rejects_is_an_error(tmp_path):
    from specdec.triton.replicas import check_config

    bad = tmp_path / "bad.cfg"
    bad.write_text("frontend x\n    bind 127.0.0.1:1\n    no-such-keyword\n")
    with pytest.raises(ServerError, match="haproxy rejects"):
        check_config(bad)
