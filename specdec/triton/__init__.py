"""The Triton side: the tensor contract's parsing and layout (tensors.py), the spec_decode
service over engine calls (service.py) and its pass-through for in-engine speculation
(passthrough.py), the LLM API engine (llmapi.py), the CPU stand-in for TensorRT-LLM (standin.py)
and the tritonserver process (serve.py). The model_repository/ adapters call into it."""
