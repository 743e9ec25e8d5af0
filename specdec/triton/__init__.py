"""The Triton side: the tensor contract's parsing and layout (tensors.py), the spec_decode
service over engine calls (service.py) and its pass-through for in-engine speculation
(passthrough.py), the LLM API engine (llmapi.py), the CPU stand-in for TensorRT-LLM (standin.py),
the tritonserver process (serve.py), the edge clients reach in front of it (edge.py) and the key
its internal models take calls with (internal.py). The model_repository/ adapters call into it."""
