"""deploy/haproxy: the configuration `specdec replicas` renders is valid for Debian's haproxy
(`haproxy -c`, no warning) and says what the failover relies on: readiness checked on each
replica's /health/ready at least every second, the HTTP and gRPC backends tracking it, gRPC in HTTP/2 on
both sides, sessions shut on a replica marked down, new requests sent elsewhere.
tests/server/test_replicas.py runs it in front of real replicas."""

from __future__ import annotations

import re
import subprocess

import pytest

from specdec.openai.server import Frontend, application
from specdec.triton.replicas import CHECKED, HAPROXY_TEMPLATE, TRACKING, BalancerPorts, find_haproxy, render_haproxy
from specdec.triton.serve import Ports, ServerError

INSTALL = "./run's setup installs Debian's haproxy package (apt-get install haproxy)"
REPLICAS = [Ports(20001, 20002, 20003, 20004), Ports(20011, 20012, 20013, 20014), Ports(20021, 20022, 20023, 20024)]
BALANCER = BalancerPorts(28000, 28001, 29000, 28404)


def haproxy() -> str:
    try:
        return str(find_haproxy())
    except ServerError:
        pytest.fail(f"no haproxy: {INSTALL}")


def rendered(tmp_path, count: int = 2) -> str:
    return render_haproxy(REPLICAS[:count], "127.0.0.1", BALANCER, tmp_path / "haproxy.sock")


def sections(config: str) -> dict[str, list[str]]:
    """{"frontend grpc": [its lines, stripped], ...}; comments and blank lines left out."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in config.splitlines():
        text = line.split("#", 1)[0].rstrip()
        if not text.strip():
            continue
        if not text.startswith(" "):
            current = text.strip()
            out[current] = []
        else:
            out[current].append(text.strip())
    return out


@pytest.mark.parametrize("count", [1, 2, 3])
def test_haproxy_accepts_the_rendered_config(tmp_path, count):
    path = tmp_path / "haproxy.cfg"
    path.write_text(rendered(tmp_path, count))
    done = subprocess.run([haproxy(), "-c", "-f", str(path)], capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Configuration file is valid" in output
    assert "[WARNING]" not in output and "[ALERT]" not in output, output


def test_every_placeholder_is_filled(tmp_path):
    config = rendered(tmp_path)
    assert "${" not in config and "$" not in config.replace("$$", "")
    placeholders = set(re.findall(r"\$\{(\w+)\}", HAPROXY_TEMPLATE.read_text()))
    assert placeholders == {"host", "http_port", "grpc_port", "openai_port", "stats_port", "stats_socket",
                            "openai_servers", "http_servers", "grpc_servers"}  # fmt: skip


def test_readiness_is_each_replicas_health_ready_checked_often(tmp_path):
    s = sections(rendered(tmp_path))
    checked = s[f"backend {CHECKED}"]
    assert "option httpchk" in checked
    assert "http-check send meth GET uri /health/ready" in checked
    assert "http-check expect status 200" in checked
    servers = [line.split() for line in checked if line.startswith("server ")]
    assert [w[1:4] for w in servers] == [["r0", "127.0.0.1:20004", "check"], ["r1", "127.0.0.1:20014", "check"]]
    default = next(line for line in s["defaults"] if line.startswith("default-server")).split()
    options = dict(zip(default[1::2], default[2::2], strict=True))
    assert options["inter"] in ("500ms", "1s") and int(options["fall"]) <= 2 and int(options["rise"]) <= 2
    assert options["on-marked-down"] == "shutdown-sessions"
    # the OpenAI frontend serves the path checked
    app = application(Frontend("127.0.0.1:1", "m", 16), 1 << 20)
    assert "/health/ready" in {r.canonical for r in app.router.resources()}


def test_http_and_grpc_follow_the_same_check(tmp_path):
    s = sections(rendered(tmp_path))
    ports = {"triton_http": (20001, 20011), "triton_grpc": (20002, 20012)}
    for backend in TRACKING:
        servers = [line for line in s[f"backend {backend}"] if line.startswith("server ")]
        assert len(servers) == 2
        for i, line in enumerate(servers):
            words = line.split()
            assert words[1:3] == [f"r{i}", f"127.0.0.1:{ports[backend][i]}"]
            assert f"track {CHECKED}/r{i}" in line and " check" not in line
            assert ("proto h2" in line) == (backend == "triton_grpc")


def test_grpc_is_http2_on_both_sides_and_requests_go_elsewhere_after_a_failure(tmp_path):
    s = sections(rendered(tmp_path))
    assert s["frontend grpc"][0] == "bind 127.0.0.1:28001 proto h2"
    assert s["frontend http"][0] == "bind 127.0.0.1:28000"
    assert s["frontend openai"][0] == "bind 127.0.0.1:29000"
    assert "bind 127.0.0.1:28404" in s["frontend stats"]
    defaults = s["defaults"]
    retry_on = next(line for line in defaults if line.startswith("retry-on")).split()[1:]
    assert {"conn-failure", "empty-response", "503"} <= set(retry_on)
    assert "option redispatch 1" in defaults and "retries 2" in defaults
    assert "mode http" in defaults
    for backend in (CHECKED, *TRACKING):
        assert "balance leastconn" in s[f"backend {backend}"]
    assert any(line.startswith("stats socket ") and "level admin" in line for line in s["global"])
