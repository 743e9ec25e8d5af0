"""The OpenAI-compatible frontend: /v1/models, /v1/chat/completions and /v1/completions, served
beside Triton by `specdec serve` and answered through the same ensemble (protocol.py: the API's
requests and objects; server.py: the HTTP server)."""
