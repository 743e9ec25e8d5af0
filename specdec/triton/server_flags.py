"""The tritonserver flags a profile's server options become (`server.tls`, `server.restricted_apis`,
`server.extra_flags`), and what the bundle's own clients need to reach a server so configured.

Pure functions of the profile and the environment (and, for TLS, of which files exist): the argv
they return goes into TritonServer.command, one argument a flag, never a shell string. The facts
they rest on (each flag, its value's kind, the restricted-API syntax) are
specdec/build/triton_flags.py's; what a profile may set is decided here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Literal

from specdec.build.triton_flags import (
    CONTAINER_FLAGS,
    DEPRECATED,
    FLAGS,
    GRPC_HEADER_PREFIX,
    RESTRICTED_FLAGS,
    Flag,
)
from specdec.config import ExtraFlag, Profile, ProfileError, RestrictedApi, ServerOptions, header_value_problem

# The flags the bundle sets itself (TritonServer.command, specdec/triton/serve.py), each with what
# sets it: a profile gives the value there, not as an extra flag.
BUNDLE_SETS: dict[str, str] = {
    "model-repository": "the bundle: the profile's build (`specdec build` renders it in build_dir)",
    "model-store": "the bundle: the profile's build (`specdec build` renders it in build_dir)",
    "backend-directory": "the bundle (the Python backend it assembles, or the container's)",
    "http-address": "server.host (or `specdec serve --host`)",
    "grpc-address": "server.host (or `specdec serve --host`)",
    "metrics-address": "server.host (or `specdec serve --host`)",
    "http-port": "server.http_port (or `specdec serve --http-port`)",
    "grpc-port": "server.grpc_port (or `specdec serve --grpc-port`)",
    "metrics-port": "server.metrics_port (or `specdec serve --metrics-port`)",
    "allow-metrics": "the bundle: `specdec serve` reads spec_decode's metrics to drain before it stops",
    "model-control-mode": "the bundle: model control stays off (none), so no client can load or unload models",
    "strict-readiness": "the bundle: ready means every model loaded, which `specdec serve` waits for",
    "disable-auto-complete-config": "the bundle: the rendered model configs are complete",
    "exit-timeout-secs": "the bundle: `specdec serve` drains requests, then stops the server within its own timeout",
    "grpc-use-ssl": "server.tls",
    "grpc-use-ssl-mutual": "server.tls (client_ca_cert)",
    "grpc-server-cert": "server.tls.cert",
    "grpc-server-key": "server.tls.key",
    "grpc-root-cert": "server.tls.client_ca_cert",
    "http-restricted-api": "server.restricted_apis (protocol: http)",
    "grpc-restricted-protocol": "server.restricted_apis (protocol: grpc)",
}
# backend-config settings the bundle sets: a k-token draft's generation logits (k * V floats) need
# room in the Python backend's shared memory
BUNDLE_BACKEND_CONFIG = ("python,shm-default-byte-size=", "python,shm-growth-byte-size=")
# What the bundle sets for TensorRT-LLM's orchestrator mode (specdec/build/trtllm.py launch_command):
# after the profile's flags on the command line, so a profile's value would be replaced.
TRTLLM_SETS = ("pinned-memory-pool-byte-size", "enable-peer-access", "cuda-memory-pool-byte-size")
# SageMaker and Vertex AI endpoints: each would open another port, on every interface
LISTENS_ON_ALL = tuple(
    f for f in FLAGS if f.startswith(("allow-sagemaker", "sagemaker-", "allow-vertex-ai", "vertex-ai-"))
)
REFUSED: dict[str, str] = {
    "help": "prints the usage and exits",
    "allow-http": "`specdec serve` waits on the HTTP endpoint's /v2/health/ready",
    "allow-grpc": "the OpenAI frontend and specdec's clients use the gRPC endpoint",
    "load-model": "model control stays off (--model-control-mode=none)",
    "repository-poll-secs": "model control stays off (--model-control-mode=none)",
    "model-config-name": "the bundle renders each model's config.pbtxt for the profile",
    "log-file": "the log goes to the bundle's log file, whose tail `specdec serve` shows when the server dies",
    **dict.fromkeys(LISTENS_ON_ALL, "listens on 0.0.0.0: tritonserver 2.51 has no option to bind it to server.host"),
    **{flag: "deprecated in tritonserver 2.51 (see its --help for the replacement)" for flag in DEPRECATED},
}
# Bundle defaults a profile may replace: the profile's flag comes after the bundle's, and
# tritonserver keeps the last value of a flag that does not repeat.
OVERRIDABLE = ("log-verbose",)
# The OpenAI frontend's gRPC headers (JSON {name: value}) reach it in this environment variable,
# not on its command line, which any local user can read.
HEADERS_ENV = "SPECDEC_TRITON_HEADERS"
# The edge's copy of gRPC inference's restricted header and value, JSON [header, value] (stream_key).
STREAM_KEY_ENV = "SPECDEC_EDGE_STREAM_KEY"

Protocol = Literal["http", "grpc"]


def server_flags(profile: Profile, environ: Mapping[str, str] = os.environ, container: bool = False) -> list[str]:
    """The tritonserver flags of the profile's server.tls, server.restricted_apis and
    server.extra_flags, in that order, for the bundled tritonserver 2.51 or (`container`) the GPU
    image's 2.61. ProfileError listing every problem, each naming its key: a TLS file that is
    missing, a header value's environment variable that is unset, a flag that tritonserver does not
    have, one the bundle sets or refuses, a value of the wrong kind."""
    server = profile.server
    problems: list[str] = []
    argv = tls_flags(server, problems)
    for i, group in enumerate(server.restricted_apis):
        value = restricted_value(group, f"server.restricted_apis.{i}", environ, problems)
        if value is not None:
            argv.append(f"--{RESTRICTED_FLAGS[group.protocol]}={','.join(group.apis)}:{group.header}={value}")
    seen: dict[str, int] = {}
    for i, extra in enumerate(server.extra_flags):
        argv += extra_flag(extra, f"server.extra_flags.{i}", profile.backend == "tensorrtllm", seen, problems,
                           container)  # fmt: skip
        seen.setdefault(extra.flag, i)
    if problems:
        raise ProfileError(f"{profile.name}: cannot start tritonserver\n" + "\n".join(f"  {p}" for p in problems))
    return argv


def tls_flags(server: ServerOptions, problems: list[str]) -> list[str]:
    """TLS on the gRPC endpoint: --grpc-use-ssl, or --grpc-use-ssl-mutual with the client CA as
    --grpc-root-cert. A missing file is a problem (tritonserver would read it as empty)."""
    tls = server.tls
    if tls is None:
        return []
    for key, path in tls.files().items():
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            problems.append(f"server.tls.{key}: no readable file {path}")
    argv = ["--grpc-use-ssl-mutual=true" if tls.client_ca_cert else "--grpc-use-ssl=true"]
    argv += [f"--grpc-server-cert={tls.cert}", f"--grpc-server-key={tls.key}"]
    return argv + ([f"--grpc-root-cert={tls.client_ca_cert}"] if tls.client_ca_cert else [])


def restricted_value(group: RestrictedApi, key: str, environ: Mapping[str, str], problems: list[str]) -> str | None:
    """The group's header value (from its environment variable, where it names one), or None
    with a problem naming `key`."""
    if group.value is not None:
        return group.value
    value = environ.get(group.value_env or "")
    if value is None:
        problems.append(f"{key}.value_env: the environment variable {group.value_env} is not set")
    elif problem := header_value_problem(value):
        problems.append(f"{key}.value_env: the value of {group.value_env} {problem}")
        return None
    return value


def extra_flag(extra: ExtraFlag, key: str, trtllm: bool, seen: dict[str, int], problems: list[str],
               container: bool = False) -> list[str]:  # fmt: skip
    """The argument of one extra flag ([] with a problem naming `key` when it may not be given).
    seen: the flags given before it, with their index; container: for the GPU image's tritonserver
    2.61 (its options are 2.51's and CONTAINER_FLAGS)."""
    name = extra.flag.removeprefix("--")
    fact = FLAGS.get(name) or (CONTAINER_FLAGS.get(name) if container else None)
    refusal = None
    if fact is None and name in CONTAINER_FLAGS:
        refusal = (f"{extra.flag} is tritonserver 2.61's (the GPU image's); the bundled tritonserver 2.51 has no "
                   "such option")  # fmt: skip
    elif fact is None:
        version = "2.61" if container else "2.51"
        refusal = f"tritonserver {version} has no option {extra.flag} (specdec/build/triton_flags.py lists its options)"
    elif name in BUNDLE_SETS:
        refusal = f"{extra.flag} is set by {BUNDLE_SETS[name]}"
    elif name in REFUSED:
        refusal = f"{extra.flag} is refused: {REFUSED[name]}"
    elif trtllm and name in TRTLLM_SETS:
        refusal = f"{extra.flag} is set by the bundle for backend tensorrtllm (specdec/build/trtllm.py launch_command)"
    elif not fact.repeatable and extra.flag in seen:
        refusal = f"{extra.flag} is given twice (also server.extra_flags.{seen[extra.flag]}); it takes one value"
    if refusal is not None:
        problems.append(f"{key}.flag: {refusal}")
        return []
    assert fact is not None
    text = flag_value(fact, extra.value)
    if isinstance(text, ValueError):
        problems.append(f"{key}.value: {extra.flag} {text}")
        return []
    if name == "backend-config" and text.startswith(BUNDLE_BACKEND_CONFIG):
        problems.append(f"{key}.value: {text.split('=')[0]} is set by the bundle (room for draft logits)")
        return []
    return [f"--{name}" if text is None else f"--{name}={text}"]


def flag_value(fact: Flag, value: bool | int | float | str | None) -> str | ValueError | None:
    """The value as tritonserver takes it (None: the flag takes none), or why it does not fit."""
    if fact.kind == "none":
        return None if value is None else ValueError("takes no value")
    if value is None:
        return ValueError(f"needs a value ({_expects(fact)})")
    if fact.kind == "bool":
        return ("true" if value else "false") if isinstance(value, bool) else ValueError("takes true or false")
    if fact.kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            return ValueError("takes an integer")
        if (fact.minimum is not None and value < fact.minimum) or (fact.maximum is not None and value > fact.maximum):
            bounds = f"{fact.minimum} to {fact.maximum}" if fact.maximum is not None else f"{fact.minimum} or more"
            return ValueError(f"takes an integer from {bounds}, got {value}")
        return str(value)
    if fact.kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return str(value) if ok else ValueError("takes a number")
    if not isinstance(value, str) or not value or any(c < " " or c == "\x7f" for c in value):
        return ValueError(f"takes text ({_expects(fact)}) without control characters")
    if fact.kind == "choice" and value not in fact.choices:
        return ValueError(f"takes one of {', '.join(fact.choices)}, got {value!r}")
    if fact.kind == "format" and not re.fullmatch(fact.pattern, value):
        return ValueError(f"takes a value shaped {fact.pattern!r} (see tritonserver --help), got {value!r}")
    return value


def _expects(fact: Flag) -> str:
    shapes = {"choice": f"one of {', '.join(fact.choices)}", "format": f"shaped {fact.pattern!r}"}
    return shapes.get(fact.kind, fact.kind)


# --- the bundle's own clients -------------------------------------------------------------------------
def client_headers(
    server: ServerOptions, protocol: Protocol, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The headers a client of the bundle (the OpenAI frontend, `specdec` commands that start the
    profile's server) sends over `protocol` to pass every restricted API group of it: over gRPC
    triton-grpc-protocol-<header>. ProfileError when a value's environment variable is unset."""
    headers, problems = {}, []
    for i, group in enumerate(server.restricted_apis):
        if group.protocol == protocol:
            value = restricted_value(group, f"server.restricted_apis.{i}", environ, problems)
            headers[(GRPC_HEADER_PREFIX if protocol == "grpc" else "") + group.header] = value or ""
    if problems:
        raise ProfileError("\n".join(problems))
    return headers


def client_tls(server: ServerOptions) -> dict[str, bool | str | None]:
    """How a gRPC client of the bundle reaches the server (specdec.client.client.Access's TLS
    fields): over TLS, trusting tls.ca_cert (or the self-signed tls.cert), checking the
    certificate against tls.server_name where given and, for mutual TLS, presenting
    tls.client_cert; {} without TLS."""
    tls = server.tls
    if tls is None:
        return {}
    return {"tls": True, "root_cert": tls.ca_cert or tls.cert, "cert": tls.client_cert, "key": tls.client_key,
            "server_name": tls.server_name}  # fmt: skip


def stream_key(server: ServerOptions, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The gRPC header and value of the restricted group holding `inference` ({} when gRPC
    inference is open), for the edge (specdec/triton/edge.py) to check a stream when it opens, as
    tritonserver does (GRPC_STREAM_CHECKED_AT_OPEN_WHERE). In STREAM_KEY_ENV as JSON, not on its
    command line. ProfileError as client_headers'."""
    for group in server.restricted_apis:
        if group.protocol == "grpc" and "inference" in group.apis:
            header = GRPC_HEADER_PREFIX + group.header
            return {STREAM_KEY_ENV: json.dumps([header, client_headers(server, "grpc", environ)[header]])}
    return {}


def frontend_access(server: ServerOptions, environ: Mapping[str, str] = os.environ) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment variables (beside their others) that let the bundle's own
    processes in front of tritonserver (the OpenAI frontend, specdec/openai/server.py) reach its TLS
    or restricted gRPC endpoint: the TLS files as --triton-root-cert, --triton-cert, --triton-key,
    the certificate's name as --triton-server-name, the headers as JSON in HEADERS_ENV."""
    tls = client_tls(server)
    names = {"root_cert": "--triton-root-cert", "cert": "--triton-cert", "key": "--triton-key",
             "server_name": "--triton-server-name"}  # fmt: skip
    argv = [f"{flag}={tls[key]}" for key, flag in names.items() if tls.get(key)]
    headers = client_headers(server, "grpc", environ)
    return argv, ({HEADERS_ENV: json.dumps(headers)} if headers else {})
