"""The client programs users copy (client/*.py), run as a user runs them against the real server:
the generation's text and figures on stdout, a refused request's field on stderr."""

from __future__ import annotations

import subprocess
import sys

from specdec.config import REPO_ROOT

PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog."


def run(program: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "client" / program), *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_grpc_streaming_prints_the_text_and_its_acceptance(server):
    done = run("grpc_stream.py", PROMPT, "--url", server.grpc_url, "--max-tokens", "24", "--num-draft-tokens", "4")
    assert done.returncode == 0, done.stderr
    text, figures = done.stdout.rsplit("\n[", 1)
    assert "quick brown fox" in text and " tokens; " in figures and "drafted" in figures


def test_http_generate_and_generate_stream_print_the_same_text(server):
    whole = run("http_generate.py", PROMPT, "--url", server.http_url, "--max-tokens", "24")
    streamed = run("http_generate.py", PROMPT, "--url", server.http_url, "--max-tokens", "24", "--stream")
    assert whole.returncode == streamed.returncode == 0, whole.stderr + streamed.stderr
    assert whole.stdout.rsplit("\n[", 1)[0].strip() == streamed.stdout.rsplit("\n[", 1)[0].strip() != ""


def test_a_refused_request_names_the_field(server):
    done = run("http_generate.py", PROMPT, "--url", server.http_url, "--max-tokens", "0")
    assert done.returncode == 1 and "error 400" in done.stderr and "max_tokens" in done.stderr
