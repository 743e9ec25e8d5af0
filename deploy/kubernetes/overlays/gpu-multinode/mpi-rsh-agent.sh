#!/usr/bin/env bash
# mpirun's rsh agent in a LeaderWorkerSet group (the leader's SPECDEC_MPI_RSH_AGENT): runs what
# mpirun starts on another pod of the group in that pod's server container, through `kubectl exec`,
# as lws's own TensorRT-LLM example reaches its workers (kubernetes-sigs/lws v0.10.0,
# docs/examples/tensorrt-llm/build/server.py lines 203-220). mpirun calls an rsh agent as
# `AGENT HOST COMMAND...`, COMMAND being a remote shell's command line: a shell reads it there.
# Needs kubectl in the image and the leader's service account (rbac.yaml).
set -euo pipefail
pod=$1
shift
exec kubectl exec -i "$pod" -c specdec -- /bin/sh -c "$*"
