#!/usr/bin/env bash
# The build of configs/vicuna-7b-medusa.yaml: TensorRT-LLM 1.0.0, in nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3.
# Generated: ./run build --profile configs/vicuna-7b-medusa.yaml --script > build_scripts/vicuna-7b-medusa.sh
# (tests/unit/build/test_scripts.py fails when it differs from what the profile generates).
# `specdec build` runs the same commands, resumably, with a log per step.
set -euo pipefail

# weights (Hugging Face checkpoints):
#   target: /models/vicuna-7b-v1.3  (hf download lmsys/vicuna-7b-v1.3 --local-dir /models/vicuna-7b-v1.3)
#   trtllm.medusa.heads: /models/medusa-vicuna-7b-v1.3  (hf download FasterDecoding/medusa-vicuna-7b-v1.3 --local-dir /models/medusa-vicuna-7b-v1.3)
# the converters are TensorRT-LLM's examples/ (in the image: /opt/tensorrt_llm/examples)

# [1/2] convert target checkpoint
python3 /opt/tensorrt_llm/examples/medusa/convert_checkpoint.py --model_dir /models/vicuna-7b-v1.3 --output_dir /engines/vicuna-7b-medusa/checkpoints/target --dtype float16 --tp_size 1 --pp_size 1 --medusa_model_dir /models/medusa-vicuna-7b-v1.3 --num_medusa_heads 4 --num_medusa_layers 1 --max_medusa_token_len 15 --workers 1

# [2/2] build target engine
trtllm-build --checkpoint_dir /engines/vicuna-7b-medusa/checkpoints/target --output_dir /engines/vicuna-7b-medusa/engines/target --max_batch_size 16 --max_input_len 1024 --max_seq_len 2048 --max_num_tokens 8192 --gemm_plugin float16 --kv_cache_type paged --use_paged_context_fmha enable --speculative_decoding_mode medusa --max_draft_len 15 --workers 1

# the model repository that tritonserver serves
specdec build --profile configs/vicuna-7b-medusa.yaml --render-only
