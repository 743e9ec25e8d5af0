#!/usr/bin/env bash
# The build of configs/llama3.1-8b-pytorch-cuda.yaml: TensorRT-LLM 1.0.0, in nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3.
# Generated: ./run build --profile configs/llama3.1-8b-pytorch-cuda.yaml --script > build_scripts/llama3.1-8b-pytorch-cuda.sh
# (tests/unit/build/test_scripts.py fails when it differs from what the profile generates).
# `specdec build` runs the same commands, resumably, with a log per step.
set -euo pipefail

# weights (Hugging Face checkpoints):
#   target: /models/Llama-3.1-8B-Instruct  (hf download meta-llama/Llama-3.1-8B-Instruct --local-dir /models/Llama-3.1-8B-Instruct)
#   draft: /models/Llama-3.2-1B-Instruct  (hf download meta-llama/Llama-3.2-1B-Instruct --local-dir /models/Llama-3.2-1B-Instruct)
# the PyTorch engine loads them in place: nothing to convert or build

# the model repository that tritonserver serves
specdec build --profile configs/llama3.1-8b-pytorch-cuda.yaml --render-only
