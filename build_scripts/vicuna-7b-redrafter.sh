#!/usr/bin/env bash
# The build of configs/vicuna-7b-redrafter.yaml: TensorRT-LLM 1.0.0, in nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3.
# Generated: ./run build --profile configs/vicuna-7b-redrafter.yaml --script > build_scripts/vicuna-7b-redrafter.sh
# (tests/unit/build/test_scripts.py fails when it differs from what the profile generates).
# `specdec build` runs the same commands, resumably, with a log per step.
set -euo pipefail

# weights (Hugging Face checkpoints):
#   target: /models/vicuna-7b-v1.3  (hf download lmsys/vicuna-7b-v1.3 --local-dir /models/vicuna-7b-v1.3)
#   trtllm.redrafter.drafter: /models/redrafter-vicuna-7b-v1.3  (bring your own)
# the converters are TensorRT-LLM's examples/ (in the image: /opt/tensorrt_llm/examples)

# [1/3] convert target base checkpoint
python3 /opt/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py --model_dir /models/vicuna-7b-v1.3 --output_dir /engines/vicuna-7b-redrafter/checkpoints/target-base --dtype float16 --tp_size 1 --pp_size 1 --workers 1

# [2/3] convert target checkpoint
python3 /opt/tensorrt_llm/examples/redrafter/convert_checkpoint.py --base_model_checkpoint_dir /engines/vicuna-7b-redrafter/checkpoints/target-base --output_dir /engines/vicuna-7b-redrafter/checkpoints/target --dtype float16 --tp_size 1 --drafter_model_dir /models/redrafter-vicuna-7b-v1.3 --redrafter_num_beams 4 --redrafter_draft_len_per_beam 5 --workers 1

# [3/3] build target engine
trtllm-build --checkpoint_dir /engines/vicuna-7b-redrafter/checkpoints/target --output_dir /engines/vicuna-7b-redrafter/engines/target --max_batch_size 16 --max_input_len 1024 --max_seq_len 2048 --max_num_tokens 8192 --gemm_plugin float16 --kv_cache_type paged --use_paged_context_fmha enable --speculative_decoding_mode explicit_draft_tokens --workers 1

# the model repository that tritonserver serves
specdec build --profile configs/vicuna-7b-redrafter.yaml --render-only
