#!/usr/bin/env bash
# The container's entrypoint: build what the chosen profile needs into its build_dir (a mounted
# volume keeps engines between runs; steps already done are skipped), then serve it with
# `specdec serve`, which restarts a dead tritonserver or Python stub (server.max_restarts) and past
# that exits 1, ending the container (`docker run --restart on-failure` starts it again).
#   docker/entrypoint.sh [PROFILE]    default: $SPECDEC_PROFILE, else configs/embedded.yaml
# Without Docker it runs the same way: with no /opt/tritonserver, `specdec serve` uses the
# tritonserver of the nvidia-pytriton wheel (CPU), so the embedded profile works end to end.
# SPECDEC_HOST, SPECDEC_HTTP_PORT, SPECDEC_GRPC_PORT, SPECDEC_METRICS_PORT, SPECDEC_OPENAI_PORT
# (0: no OpenAI-compatible API) override the profile's server section (HTTP and gRPC are the
# edge's, which serves clients the ensemble only: tritonserver itself listens on 127.0.0.1); SPECDEC_PYTHON is the interpreter that has the specdec package (python3).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
profile=${1:-${SPECDEC_PROFILE:-$root/configs/embedded.yaml}}
python=${SPECDEC_PYTHON:-python3}

"$python" -m specdec.cli build --profile "$profile"

args=(--profile "$profile")
[[ -n ${SPECDEC_HOST:-} ]] && args+=(--host "$SPECDEC_HOST")
[[ -n ${SPECDEC_HTTP_PORT:-} ]] && args+=(--http-port "$SPECDEC_HTTP_PORT")
[[ -n ${SPECDEC_GRPC_PORT:-} ]] && args+=(--grpc-port "$SPECDEC_GRPC_PORT")
[[ -n ${SPECDEC_METRICS_PORT:-} ]] && args+=(--metrics-port "$SPECDEC_METRICS_PORT")
[[ -n ${SPECDEC_OPENAI_PORT:-} ]] && args+=(--openai-port "$SPECDEC_OPENAI_PORT")
exec "$python" -m specdec.cli serve --no-build "${args[@]}"
