"""What the server's edge forwards and what it refuses (specdec/triton/edge.py). The edge in front
of the real tritonserver is tested in tests/server/test_security.py."""

from __future__ import annotations

import pytest
from tritonclient.grpc.service_pb2 import DESCRIPTOR, ModelInferRequest

from specdec.triton.edge import (
    GRPC_HEALTH,
    GRPC_INFER,
    GRPC_SERVICE,
    GRPC_STREAM,
    forwarded_headers,
    grpc_refusal,
    http_refusal,
    infer_refusal,
    upstream_port,
)


@pytest.mark.parametrize(
    "path",
    ["/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/stats", "/v2/models/ensemble/infer",
     "/v2/models/ensemble/versions/1/infer", "/v2/models/ensemble/generate", "/v2/models/ensemble/generate_stream",
     "/v2/models/ensemble", "/v2/models/target/config", "/v2/models/spec_decode/ready",
     "/v2/models/preprocessing/versions/1/stats", "/v2/models/draft"],
)  # fmt: skip
def test_what_clients_use_passes(path):
    assert http_refusal(path) is None


@pytest.mark.parametrize(
    "path, model",
    [("/v2/models/target/infer", "target"), ("/v2/models/draft/generate", "draft"),
     ("/v2/models/spec_decode/generate_stream", "spec_decode"), ("/v2/models/preprocessing/infer", "preprocessing"),
     ("/v2/models/postprocessing/versions/1/infer", "postprocessing"),
     # matched as sent, as tritonserver matches them: an encoded name is not the ensemble
     ("/v2/models/%65nsemble/infer", "%65nsemble")],
)  # fmt: skip
def test_inference_of_another_model_is_refused_naming_it(path, model):
    assert http_refusal(path) == f"{model}: internal model; clients call the ensemble"


@pytest.mark.parametrize(
    "path",
    ["/v2/repository/index", "/v2/repository/models/target/load", "/v2/systemsharedmemory/region/x/register",
     "/v2/cudasharedmemory/status", "/v2/trace/setting", "/v2/models/ensemble/trace/setting", "/v2/logging",
     "/v2/models/ensemble/infer/", "/v2/models/ensemble/../target/infer", "/metrics", "/"],
)  # fmt: skip
def test_operators_apis_and_unknown_paths_are_refused(path):
    assert http_refusal(path) == f"{path}: not served to clients"


def test_every_method_of_tritonservers_service_is_placed():
    """Each method the gRPC service has is forwarded or refused by name, none by accident."""
    methods = {m.name for m in DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    refused = {m for m in methods if grpc_refusal(f"/{GRPC_SERVICE}/{m}")}
    assert methods - refused == {"ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata",
                                 "ModelConfig", "ModelStatistics", "ModelInfer", "ModelStreamInfer"}  # fmt: skip
    assert grpc_refusal(GRPC_HEALTH) is None and grpc_refusal(GRPC_INFER) is None and grpc_refusal(GRPC_STREAM) is None
    assert grpc_refusal(f"/{GRPC_SERVICE}/RepositoryModelLoad") == "RepositoryModelLoad: not served to clients"


def test_inference_requests_are_checked_by_the_model_they_name():
    assert infer_refusal(ModelInferRequest(model_name="ensemble").SerializeToString()) is None
    assert infer_refusal(ModelInferRequest(model_name="target").SerializeToString()) == (
        "target: internal model; clients call the ensemble"
    )
    assert infer_refusal(b"\xff\xff\xff") == "the request is not a ModelInferRequest"
    assert infer_refusal(ModelInferRequest(model_name="x").SerializeToString(), served=("x",)) is None


def test_hop_by_hop_headers_stay_behind():
    headers = [("Connection", "keep-alive"), ("Transfer-Encoding", "chunked"), ("Host", "a"), ("Content-Length", "9"),
               ("Expect", "100-continue"), ("Content-Type", "application/json"), ("x-key", "v")]  # fmt: skip
    assert forwarded_headers(headers) == [("Content-Type", "application/json"), ("x-key", "v")]


def test_the_edges_command_line_names_the_tritonserver_behind_it():
    edge = ["python", "-m", "specdec.triton.edge", "--http=0.0.0.0:8000", "--triton-grpc=127.0.0.1:4321"]
    assert upstream_port(edge) == 4321
    assert upstream_port(["tritonserver", "--grpc-port=8001"]) is None
