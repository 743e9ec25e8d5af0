"""The tritonserver command line this bundle relies on: Triton Inference Server 2.51.0, the server
the nvidia-pytriton 0.7.0 wheel ships (its log says server_version 2.51.0), each fact with the
file, tag and lines of triton-inference-server/server it was read from.

Facts only, read from upstream's source at tag v2.51.0 (commit e0f0734d); `tests/unit/build/
test_triton_flags.py` also compares the flag list with the bundled binary's own `--help`. Which
of these flags a profile may give, and how a profile's options become flags, is decided in
specdec/triton/server_flags.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specdec.build.upstream import Where

SERVER_REPO = "triton-inference-server/server"
TRITON_SERVER_TAG = "v2.51.0"


def _clp(lines: str) -> Where:
    return Where(SERVER_REPO, "src/command_line_parser.cc", TRITON_SERVER_TAG, lines)


def _at(path: str, lines: str) -> Where:
    return Where(SERVER_REPO, path, TRITON_SERVER_TAG, lines)


# --- how values parse -------------------------------------------------------------------------------
# A bool flag takes true/on/1 or false/off/0, in any case (ParseOption<bool>, 176-193); an int or
# float one takes what std::stoi / std::stod parse whole (ParseOption, 156-174). Each flag's value
# follows `--name=` in one argument (getopt_long over the long options, 1294-1304); an argument
# that is no option ends parsing with "Unexpected argument" (1757-1759).
BOOL_WHERE = _clp("176-193")
FlagKind = Literal["none", "bool", "int", "float", "string", "choice", "format"]


@dataclass(frozen=True)
class Flag:
    """One tritonserver option. kind: "none" takes no value; "choice" one of `choices` (as
    written: some are compared case-insensitively upstream, all are accepted here as listed);
    "format" a compound value matching `pattern` (the format upstream's parser splits).
    repeatable: each occurrence adds a setting; for the others a later one replaces an earlier one."""

    where: Where
    kind: FlagKind
    choices: tuple[str, ...] = ()
    pattern: str = ""
    repeatable: bool = False
    minimum: int | None = None  # an "int" the parser refuses below this
    maximum: int | None = None  # ... or above this


_SETTING = r"[^,=]+,[^=]+=.+"  # <name>,<setting>=<value> (ParseGenericConfigOption, 2080-2109)

# Every long option of tritonserver 2.51.0 (the registrations at the lines given; the parse of each
# in TritonParser::Parse, 1303-1760).
FLAGS: dict[str, Flag] = {
    "help": Flag(_clp("384"), "none"),
    "id": Flag(_clp("387"), "string"),
    "exit-timeout-secs": Flag(_clp("389"), "int"),
    "model-store": Flag(_clp("395"), "string", repeatable=True),
    "model-repository": Flag(_clp("398"), "string", repeatable=True),
    "exit-on-error": Flag(_clp("404"), "bool"),
    "disable-auto-complete-config": Flag(_clp("407"), "none"),
    "strict-readiness": Flag(_clp("414"), "bool"),
    "model-control-mode": Flag(_clp("420; 1626-1640"), "choice", ("none", "poll", "explicit")),
    "repository-poll-secs": Flag(_clp("432"), "int"),
    "load-model": Flag(_clp("437"), "string", repeatable=True),
    "model-config-name": Flag(_clp("446"), "string"),
    "model-load-thread-count": Flag(_clp("453"), "int"),
    "model-load-retry-count": Flag(_clp("458"), "int"),
    "model-namespacing": Flag(_clp("462"), "bool"),
    "enable-peer-access": Flag(_clp("466"), "bool"),
    # HTTP (473-508): no TLS option among them
    "allow-http": Flag(_clp("475"), "bool"),
    "http-address": Flag(_clp("478"), "string"),
    "http-port": Flag(_clp("481"), "int"),
    "reuse-http-port": Flag(_clp("485"), "bool"),
    "http-header-forward-pattern": Flag(_clp("491"), "string"),
    "http-thread-count": Flag(_clp("496"), "int"),
    "http-restricted-api": Flag(_clp("499; 1385-1388"), "format", pattern=r"[^:]+:[^=]+=.+", repeatable=True),
    # gRPC (510-623)
    "allow-grpc": Flag(_clp("512"), "bool"),
    "grpc-address": Flag(_clp("515"), "string"),
    "grpc-port": Flag(_clp("518"), "int"),
    "reuse-grpc-port": Flag(_clp("522"), "bool"),
    "grpc-header-forward-pattern": Flag(_clp("528"), "string"),
    "grpc-infer-allocation-pool-size": Flag(_clp("533"), "int"),
    "grpc-use-ssl": Flag(_clp("540; 1441-1443"), "bool"),
    "grpc-use-ssl-mutual": Flag(_clp("543; 1444-1447"), "bool"),
    "grpc-server-cert": Flag(_clp("547"), "string"),
    "grpc-server-key": Flag(_clp("551"), "string"),
    "grpc-root-cert": Flag(_clp("555"), "string"),
    "grpc-infer-response-compression-level": Flag(_clp("559; 1456-1472"), "choice", ("none", "low", "medium", "high")),
    "grpc-keepalive-time": Flag(_clp("565"), "int"),
    "grpc-keepalive-timeout": Flag(_clp("569"), "int"),
    "grpc-keepalive-permit-without-calls": Flag(_clp("576"), "bool"),
    "grpc-http2-max-pings-without-data": Flag(_clp("581"), "int"),
    "grpc-http2-min-recv-ping-interval-without-data": Flag(_clp("588"), "int"),
    "grpc-http2-max-ping-strikes": Flag(_clp("598"), "int"),
    "grpc-max-connection-age": Flag(_clp("604"), "int"),
    "grpc-max-connection-age-grace": Flag(_clp("609"), "int"),
    "grpc-restricted-protocol": Flag(_clp("614; 1509-1515"), "format", pattern=r"[^:]+:[^=]+=.+", repeatable=True),
    # logging
    "log-verbose": Flag(_clp("627; 1314-1316, 199-213"), "int"),  # also true (1) / false (0)
    "log-info": Flag(_clp("631"), "bool"),
    "log-warning": Flag(_clp("634"), "bool"),
    "log-error": Flag(_clp("637"), "bool"),
    "log-format": Flag(_clp("640; 1326-1335"), "choice", ("default", "ISO8601")),  # compared as written
    "log-file": Flag(_clp("646"), "string"),
    # SageMaker and Vertex AI: each listens on 0.0.0.0, with no option to choose the address
    # (src/command_line_parser.h 223, 233: sagemaker_address_, vertex_ai_address_)
    "allow-sagemaker": Flag(_clp("654"), "bool"),
    "sagemaker-port": Flag(_clp("657"), "int"),
    "sagemaker-safe-port-range": Flag(_clp("661"), "format", pattern=r"\d+-\d+"),
    "sagemaker-thread-count": Flag(_clp("666"), "int"),
    "allow-vertex-ai": Flag(_clp("672"), "bool"),
    "vertex-ai-port": Flag(_clp("676"), "int"),
    "vertex-ai-thread-count": Flag(_clp("680"), "int"),
    "vertex-ai-default-model": Flag(_clp("683"), "string"),
    # metrics
    "allow-metrics": Flag(_clp("690"), "bool"),
    "allow-gpu-metrics": Flag(_clp("693"), "bool"),
    "allow-cpu-metrics": Flag(_clp("697"), "bool"),
    "metrics-address": Flag(_clp("701"), "string"),
    "metrics-port": Flag(_clp("706"), "int"),
    # declared ArgFloat (709) but parsed with ParseOption<int> (1539-1541): whole milliseconds only
    "metrics-interval-ms": Flag(_clp("709; 1539-1541"), "int"),
    "metrics-config": Flag(_clp("713"), "format", pattern=r"[^=]+=.+", repeatable=True),
    "trace-config": Flag(_clp("721; 1601-1610"), "format", pattern=r"([^,=]+,)?[^,=]+=.+", repeatable=True),
    "cache-config": Flag(_clp("736; 1690-1697"), "format", pattern=_SETTING, repeatable=True),
    "cache-directory": Flag(_clp("743"), "string"),
    "rate-limit": Flag(_clp("752; 1641-1653"), "choice", ("execution_count", "off")),
    "rate-limit-resource": Flag(_clp("762"), "format", pattern=r"[^:]+:\d+(:\d+)?", repeatable=True),
    "pinned-memory-pool-byte-size": Flag(_clp("776"), "int"),
    "cuda-memory-pool-byte-size": Flag(_clp("786"), "format", pattern=r"\d+:\d+", repeatable=True),
    "cuda-virtual-address-size": Flag(_clp("798"), "format", pattern=r"\d+:\d+", repeatable=True),
    "min-supported-compute-capability": Flag(_clp("810"), "float"),
    "buffer-manager-thread-count": Flag(_clp("815"), "int"),
    "host-policy": Flag(_clp("820"), "format", pattern=_SETTING, repeatable=True),
    "model-load-gpu-limit": Flag(_clp("827"), "format", pattern=r"\d+:[0-9.]+", repeatable=True),
    "backend-directory": Flag(_clp("835"), "string"),
    # <backend>,<setting>=<value>, or <setting>=<value> for every backend (ParseBackendConfigOption 1998-2035)
    "backend-config": Flag(_clp("839; 1998-2035"), "format", pattern=r"([^,=]+,)?[^,=]+=.+", repeatable=True),
    "repoagent-directory": Flag(_clp("845"), "string"),
    # deprecated (each prints a warning naming its replacement)
    "strict-model-config": Flag(_clp("851"), "bool"),
    "response-cache-byte-size": Flag(_clp("858"), "int"),
    "trace-file": Flag(_clp("862"), "string"),
    "trace-level": Flag(_clp("869"), "string", repeatable=True),
    "trace-rate": Flag(_clp("875"), "int"),
    "trace-count": Flag(_clp("879"), "int"),
    "trace-log-frequency": Flag(_clp("884"), "int"),
}
DEPRECATED = ("strict-model-config", "response-cache-byte-size", "trace-file", "trace-level", "trace-rate",
              "trace-count", "trace-log-frequency")  # fmt: skip

# --- the GPU image's tritonserver: 2.61 -----------------------------------------------------------
# nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3 runs tritonserver 2.61.0
# (specdec/build/upstream.py). Its src/command_line_parser.cc (tag v2.61.0) registers every option
# above, parsed as at 2.51 (the two files differ elsewhere only in help texts), and these three
# more, each an integer the parser bounds.
CONTAINER_SERVER_TAG = "v2.61.0"


def _clp_container(lines: str) -> Where:
    return Where(SERVER_REPO, "src/command_line_parser.cc", CONTAINER_SERVER_TAG, lines)


CONTAINER_FLAGS: dict[str, Flag] = {
    # bounds one input tensor's bytes in a body already read (triton_access.py HTTP_MAX_INPUT_SIZE)
    "http-max-input-size": Flag(_clp_container("502-504; 1401-1409"), "int", minimum=1),
    "grpc-infer-thread-count": Flag(_clp_container("540-542; 1463-1471"), "int", minimum=2, maximum=128),
    "grpc-max-response-pool-size": Flag(_clp_container("551-554; 1475-1482"), "int", minimum=1),
}

# --- TLS --------------------------------------------------------------------------------------------
# gRPC only. --grpc-use-ssl turns TLS on with --grpc-server-cert and --grpc-server-key;
# --grpc-use-ssl-mutual turns it on too and requires and verifies a client certificate against
# --grpc-root-cert (command_line_parser.cc 1441-1456; grpc_server.cc 2262-2284). A file that cannot
# be read is read as empty, with no error (grpc/grpc_utils.cc ReadFile, 145-158): the bundle checks
# that each file exists before it starts the server.
GRPC_TLS_WHERE = _at("src/grpc/grpc_server.cc", "2262-2284")
TLS_FILE_READ_WHERE = _at("src/grpc/grpc_utils.cc", "145-158")
# The HTTP endpoint has no TLS in 2.51: no HTTP option for it (command_line_parser.cc 473-508) and no
# SSL in src/http_server.cc. HTTPS needs a TLS-terminating proxy in front.
HTTP_TLS = False
HTTP_TLS_WHERE = _clp("473-508")

# --- restricted APIs ------------------------------------------------------------------------------
# --http-restricted-api=<apis>:<key>=<value> and --grpc-restricted-protocol=<protocols>:<key>=<value>
# (the flags' help texts say "," before the key; the parser splits at the first ":" and the first
# "=" after it, and refuses an empty part: ParseRestrictedFeatureOption 2039-2074 through
# ParseGenericConfigOption 2080-2109). <apis> is a comma-separated list of categories; a category
# may be in one group only (2062-2067); the flag repeats for more groups.
RESTRICTED_FLAGS = {"http": "http-restricted-api", "grpc": "grpc-restricted-protocol"}
RESTRICTED_SYNTAX_WHERE = _clp("2039-2109")
# src/restricted_features.h 52-57
RESTRICTED_CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
                         "statistics", "trace", "logging")  # fmt: skip
RESTRICTED_CATEGORIES_WHERE = _at("src/restricted_features.h", "52-57")
# A gRPC client sends the header triton-grpc-protocol-<key> (src/grpc/grpc_server.h 48, prefixed at
# command_line_parser.cc 1513); an HTTP client sends <key> itself (no prefix, 1387).
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
GRPC_HEADER_PREFIX_WHERE = _at("src/grpc/grpc_server.h", "48")
# What a request without the header gets: HTTP 403 with {"error": ...} (http_server.cc
# RespondIfRestricted, 4747-4763); gRPC UNAVAILABLE (grpc_server.cc 203-206; the infer handlers,
# grpc/infer_handler.cc 757-760, grpc/stream_infer_handler.cc 185-188).
HTTP_RESTRICTED_STATUS = 403
HTTP_RESTRICTED_ERROR = "This API is restricted, expecting header '{header}'"
GRPC_RESTRICTED_ERROR = "This protocol is restricted, expecting header '{header}'"
RESTRICTED_ERROR_WHERE = (_at("src/http_server.cc", "4747-4763"), _at("src/grpc/grpc_server.cc", "196-228"))
# The `inference` category covers ModelInfer and ModelStreamInfer (grpc_server.cc 2389-2409). A
# stream is checked once, when it opens, before its first request is read: without the header it
# ends at once with the UNAVAILABLE above (stream_infer_handler.cc 174-190).
GRPC_INFERENCE_METHODS_WHERE = _at("src/grpc/grpc_server.cc", "2389-2409")
GRPC_STREAM_CHECKED_AT_OPEN_WHERE = _at("src/grpc/stream_infer_handler.cc", "174-190")
# `health` covers the server's live and ready endpoints and each model's ready endpoint, over HTTP
# (http_server.cc 1366-1369, 1619-1620) and gRPC (grpc_server.cc 458-591, with gRPC's own health
# check protocol, 504-520). The metrics endpoint (its own port) is no restricted API.
HEALTH_WHERE = (_at("src/http_server.cc", "1366-1369; 1619-1620"), _at("src/grpc/grpc_server.cc", "458-591"))
