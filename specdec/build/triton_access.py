"""What Triton 2.51 can and cannot restrict about who calls a model and how large a request may be:
the facts behind the server's edge (specdec/triton/edge.py) and the internal models' refusals
(specdec/triton/internal.py), each with the upstream file, ref and lines it was read from.

Facts only, read from upstream's source (never from memory). Refs: triton-inference-server/server
tag v2.51.0 (the nvidia-pytriton 0.7.0 wheel's server), Triton core and python_backend branch
r24.10 (the same release), tensorrtllm_backend tag v0.19.0 (the last with the backend's own source;
specdec/build/upstream.py says where later copies live), perf_analyzer branch r24.10.
"""

from __future__ import annotations

from specdec.build.upstream import BACKEND_REPO, CORE_REPO, Where

SERVER_REPO = "triton-inference-server/server"
PYTHON_BACKEND_REPO = "triton-inference-server/python_backend"
PERF_ANALYZER_REPO = "triton-inference-server/perf_analyzer"
SERVER_TAG = "v2.51.0"
RELEASE_BRANCH = "r24.10"

# --- who called: nothing in a request tells an ensemble step from a client -------------------------
# An ensemble step's request takes the ensemble request's id, correlation id, flags, priority,
# timeout and parameters (copied from the client's request at 473-478, set on each step's at
# 977-982); its inputs are only the tensors the ensemble maps. So a model cannot tell an ensemble
# step's request from a client's direct call, and a client's request parameters reach every step.
ENSEMBLE_STEP_REQUEST = Where(CORE_REPO, "src/ensemble_scheduler/ensemble_scheduler.cc", RELEASE_BRANCH,
                              "473-478, 977-982")  # fmt: skip
# A step's response parameters sequence_id / sequence_start / sequence_end set the next steps'
# correlation id and flags (652-704): a client can set those on its own request too.
ENSEMBLE_PARAMETER_OVERRIDE = Where(CORE_REPO, "src/ensemble_scheduler/ensemble_scheduler.cc", RELEASE_BRANCH,
                                    "652-704")  # fmt: skip
# Restricted APIs (--http-restricted-api, --grpc-restricted-protocol) are whole categories (health,
# metadata, inference, ...), each behind one header: no category names a model.
RESTRICTED_CATEGORIES = Where(SERVER_REPO, "src/restricted_features.h", SERVER_TAG, "38-57")

# --- how a BLS call and a stub carry the key --------------------------------------------------------
# pb_utils.InferenceRequest(parameters={str: bool | int | str}) (1714-1780); the called model reads
# them as JSON from request.parameters() (1798).
BLS_PARAMETERS = Where(PYTHON_BACKEND_REPO, "src/pb_stub.cc", RELEASE_BRANCH, "1714-1780, 1798")
# A stub is forked and exec'd through bash (341, 412-420): it inherits tritonserver's environment.
STUB_ENVIRONMENT = Where(PYTHON_BACKEND_REPO, "src/stub_launcher.cc", RELEASE_BRANCH, "341, 412-420")
# The tensorrtllm backend looks request parameters up by name (getRequestParameter, utils.h
# 369-394) and reads only triton_trtllm_request_type (utils.cc 331-345): a parameter it does not
# know, such as the key, is ignored. It cannot check a key itself: its models are reached only
# through tritonserver's own endpoints, which bind 127.0.0.1 behind the edge.
TRTLLM_REQUEST_PARAMETERS = Where(BACKEND_REPO, "inflight_batcher_llm/src/utils.h", "v0.19.0", "369-394")
TRTLLM_REQUEST_TYPE = Where(BACKEND_REPO, "inflight_batcher_llm/src/utils.cc", "v0.19.0", "331-345")

# --- how large a request may be: tritonserver bounds nothing before it has read it ------------------
# The HTTP server hands evhtp's request to its handlers with the whole body read into req->buffer_in
# (evhtp_set_gencb, 214; the handlers read evbuffer_get_length(req->buffer_in)); it sets no limit on
# a body and has no option for one. A gzip or deflate body is inflated whole, unbounded (2548-2560,
# 3150-3160).
HTTP_WHOLE_BODY = Where(SERVER_REPO, "src/http_server.cc", SERVER_TAG, "214")
HTTP_INFLATES = Where(SERVER_REPO, "src/http_server.cc", SERVER_TAG, "2548-2560, 3150-3160")
# --http-max-input-size arrived in 2.59 (v2.59.0 src/command_line_parser.cc; 64 MiB by default,
# src/common.h 62) and checks each input's size in the body already read (http_server.cc 2649-2660
# at r25.09): it bounds a tensor, not what the server reads.
HTTP_MAX_INPUT_SIZE = Where(SERVER_REPO, "src/http_server.cc", "r25.09", "2649-2660")
# The gRPC server accepts messages up to MAX_GRPC_MESSAGE_SIZE = INT32_MAX (2 GiB; common.h 48),
# set on its builder (grpc_server.cc 2285), with no option to lower it (still so at r25.09).
GRPC_MAX_MESSAGE = Where(SERVER_REPO, "src/common.h", SERVER_TAG, "48")
GRPC_MAX_MESSAGE_SET = Where(SERVER_REPO, "src/grpc/grpc_server.cc", SERVER_TAG, "2285")

# --- the routes clients use, and what tools read --------------------------------------------------
# HTTP paths (1137-1146, dispatched in Handle, 4597-4696): /v2 and /v2/health/(live|ready); /v2/models/stats;
# /v2/models/<name>[/versions/<n>][/infer|generate|generate_stream|ready|config|stats|trace/setting];
# /v2/repository..., /v2/systemsharedmemory..., /v2/cudasharedmemory..., /v2/trace/setting, /v2/logging.
# A model name is one path segment, matched as sent (no percent-decoding).
HTTP_ROUTES = Where(SERVER_REPO, "src/http_server.cc", SERVER_TAG, "1137-1146, 4597-4696")
HTTP_ERROR_BODY = Where(SERVER_REPO, "src/http_server.cc", SERVER_TAG, "128")  # {"error": "<message>"}
# Error codes over HTTP: INVALID_ARG 400, NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501 (98-121).
HTTP_ERROR_CODES = Where(SERVER_REPO, "src/http_server.cc", SERVER_TAG, "98-121")
# perf_analyzer (genai-perf's triton service kind drives it) reads the configuration of every
# composing model of an ensemble (model_parser.cc 369-377) and, where the server lists the
# statistics extension, every model's statistics (inference_profiler.cc 539, 1174-1186).
PERF_ANALYZER_COMPOSING_CONFIGS = Where(PERF_ANALYZER_REPO, "src/model_parser.cc", RELEASE_BRANCH, "369-377")
PERF_ANALYZER_STATISTICS = Where(PERF_ANALYZER_REPO, "src/inference_profiler.cc", RELEASE_BRANCH, "539, 1174-1186")
