# specdec on NVIDIA's Triton + TensorRT-LLM container. The versions are pinned together in
# specdec/build/trtllm.py (TRITON_IMAGE, TRTLLM_VERSION); tests/test_docker.py checks they agree.
#   docker build -t specdec:trtllm .
#   docker run ... specdec:trtllm              (README, "GPU: TensorRT-LLM and Docker")
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3
FROM ${TRITON_IMAGE}

# The convert_checkpoint.py scripts are examples in TensorRT-LLM's repository, not part of its
# wheel: fetch examples/ of the release the container ships.
ARG TRTLLM_VERSION=1.0.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/* \
 && git clone --depth 1 --branch v${TRTLLM_VERSION} --filter=blob:none --sparse \
      https://github.com/NVIDIA/TensorRT-LLM.git /opt/tensorrt_llm \
 && git -C /opt/tensorrt_llm sparse-checkout set examples \
 && rm -rf /opt/tensorrt_llm/.git

# The package, installed in place (its templates and profiles live beside it). torch, numpy and
# TensorRT-LLM stay the container's: no dependency resolution, then the few the image may lack,
# with numpy held at the container's version.
WORKDIR /opt/specdec
COPY pyproject.toml README.md ./
COPY specdec ./specdec
COPY model_repository ./model_repository
COPY configs ./configs
COPY assets ./assets
COPY docker ./docker
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && pip freeze | grep -i '^numpy==' > /tmp/numpy.txt \
 && pip install --no-cache-dir -c /tmp/numpy.txt numba rich psutil aiohttp "tritonclient[grpc,http]" \
 && rm /tmp/numpy.txt

# Runs as a user without root. Engines go to /engines (a volume); weights are read from /models.
RUN useradd --create-home --uid 10001 specdec \
 && mkdir -p /engines /models \
 && chown specdec /engines
USER specdec
VOLUME ["/engines"]
ENV SPECDEC_PROFILE=/opt/specdec/configs/llama3.1-8b-draft-target.yaml \
    SPECDEC_TRTLLM_EXAMPLES=/opt/tensorrt_llm/examples \
    SPECDEC_HOST=0.0.0.0

# What clients need: the edge's HTTP and gRPC (8000, 8001: the ensemble only, bodies bounded;
# specdec/triton/edge.py), metrics (8002) and the OpenAI API (9000). tritonserver's own endpoints
# listen on the container's loopback only, behind the edge.
EXPOSE 8000 8001 8002 9000
# Building engines on first start takes a while: the long start period keeps it "starting".
HEALTHCHECK --interval=30s --timeout=5s --start-period=60m --retries=3 \
    CMD ["python3", "/opt/specdec/docker/healthcheck.py"]
ENTRYPOINT ["/opt/specdec/docker/entrypoint.sh"]
