#!/usr/bin/env bash
# The build of configs/llama3.1-8b-ngram.yaml: TensorRT-LLM 1.0.0, in nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3.
# Generated: ./run build --profile configs/llama3.1-8b-ngram.yaml --script > build_scripts/llama3.1-8b-ngram.sh
# (tests/unit/build/test_scripts.py fails when it differs from what the profile generates).
# `specdec build` runs the same commands, resumably, with a log per step.
set -euo pipefail

# weights (Hugging Face checkpoints):
#   target: /models/Llama-3.1-8B-Instruct  (hf download meta-llama/Llama-3.1-8B-Instruct --local-dir /models/Llama-3.1-8B-Instruct)
# the converters are TensorRT-LLM's examples/ (in the image: /opt/tensorrt_llm/examples)

# [1/2] convert target checkpoint
python3 /opt/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py --model_dir /models/Llama-3.1-8B-Instruct --output_dir /engines/llama3.1-8b-ngram/checkpoints/target --dtype bfloat16 --tp_size 1 --pp_size 1 --workers 1

# [2/2] build target engine
trtllm-build --checkpoint_dir /engines/llama3.1-8b-ngram/checkpoints/target --output_dir /engines/llama3.1-8b-ngram/engines/target --max_batch_size 32 --max_input_len 4096 --max_seq_len 8192 --max_num_tokens 8192 --gemm_plugin bfloat16 --kv_cache_type paged --use_paged_context_fmha enable --speculative_decoding_mode draft_tokens_external --max_draft_len 8 --workers 1

# the model repository that tritonserver serves
specdec build --profile configs/llama3.1-8b-ngram.yaml --render-only
