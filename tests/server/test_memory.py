"""Memory that stays flat: benchmarks/soak.py's mixed work, a few hundred requests of it, against
the shared server; no process's resident memory may grow with the requests after warm-up."""

from __future__ import annotations

import asyncio

import pytest
import soak

pytestmark = pytest.mark.server

REQUESTS, WARMUP, SAMPLE_EVERY = 320, 120, 10
# Bytes a request, any process, over the 200 requests after warm-up: a page of allocator noise
# (4 KiB) in a fit over 20 samples moves the slope by well under this; an accumulation of the
# size the soak found (about 8 KB a request, in one process) does not fit under it.
MAX_SLOPE_BYTES = 4096


def test_mixed_requests_leave_every_process_memory_flat(server, tokenizer):
    endpoints = soak.endpoints_of(server)
    assert {"tritonserver", "edge", "openai"} <= set(endpoints.processes)
    report = asyncio.run(
        soak.soak(endpoints, tokenizer, REQUESTS, concurrency=8, deadline_s=600, warmup=WARMUP,
                  sample_every=SAMPLE_EVERY, max_tokens=16, max_slope=MAX_SLOPE_BYTES, progress=False)
    )  # fmt: skip
    slopes = report["memory"]["slopes_bytes_per_request"]
    # every process was read: tritonserver, the edge, the frontend and a stub for each model
    assert {"tritonserver", "edge", "openai", "spec_decode", "preprocessing", "postprocessing", "target"} <= set(slopes)
    assert sum(report["outcomes"].values()) == REQUESTS
    assert not any(kind.startswith("skipped") for kind in report["outcomes"]), report["outcomes"]
    assert {route for kind in report["outcomes"] for route in soak.ROUTES if f"({route})" in kind} == set(soak.ROUTES)
    per_process = ", ".join(f"{name} {s['rss']:+.0f}" for name, s in sorted(slopes.items()))
    assert not report["failures"], f"{report['failures']}; bytes a request after warm-up: {per_process}"
