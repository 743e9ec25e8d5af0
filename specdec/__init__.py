"""Speculative decoding on Triton Inference Server, in layers (docs/design.md):

    config, contract, tokenizer, texts, progress   leaf modules
    engine/        the PyTorch engine (self-contained)
    speculation/   the draft-verify loop, proposers, controller: pure of Triton
    build/         weights, TensorRT-LLM commands and the upstream record, the repository
    triton/        tensors, the spec_decode service, the stand-ins, the tritonserver process
    client/        clients, check, load generator, reports, demo
    cli.py         the `specdec` command

A module imports only from its own layer and those listed above it (tests/unit/test_layers.py).
"""
