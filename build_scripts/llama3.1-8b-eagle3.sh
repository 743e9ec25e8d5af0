#!/usr/bin/env bash
# The build of configs/llama3.1-8b-eagle3.yaml: TensorRT-LLM 1.0.0, in nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3.
# Generated: ./run build --profile configs/llama3.1-8b-eagle3.yaml --script > build_scripts/llama3.1-8b-eagle3.sh
# (tests/unit/build/test_scripts.py fails when it differs from what the profile generates).
# `specdec build` runs the same commands, resumably, with a log per step.
set -euo pipefail

# weights (Hugging Face checkpoints):
#   target: /models/Llama-3.1-8B-Instruct  (hf download meta-llama/Llama-3.1-8B-Instruct --local-dir /models/Llama-3.1-8B-Instruct)
#   trtllm.eagle3.draft: /models/EAGLE3-LLaMA3.1-Instruct-8B  (hf download yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --local-dir /models/EAGLE3-LLaMA3.1-Instruct-8B)
# eagle3: no engine build, the LLM API loads them when the server starts

# the model repository that tritonserver serves
specdec build --profile configs/llama3.1-8b-eagle3.yaml --render-only
