"""Clients of a running server: generation over gRPC and HTTP, the correctness check, the load
generator and its reports, and the demo."""
