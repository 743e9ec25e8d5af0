"""The server's own counters and processes, as the load generator reads them."""

from __future__ import annotations

from specdec.client.server_stats import delta, parse_prometheus, process_name, proposer_counters

# --- server counters and processes ----------------------------------------------------------------
METRICS = """# HELP specdec_draft_tokens_total Draft tokens proposed
# TYPE specdec_draft_tokens_total counter
specdec_draft_tokens_total{model="spec_decode",proposer="ngram"} 30
specdec_accepted_tokens_total{model="spec_decode",proposer="ngram"} 12
specdec_drafts_total{model="spec_decode",proposer="ngram"} 7
specdec_accepted_tokens_per_position_total{model="spec_decode",position="1",proposer="ngram"} 6
specdec_accepted_tokens_per_position_total{model="spec_decode",position="2",proposer="ngram"} 4
specdec_draft_tokens_per_position_total{model="spec_decode",position="1",proposer="ngram"} 7
specdec_draft_tokens_per_position_total{model="spec_decode",position="2",proposer="ngram"} 7
specdec_requests_total{model="spec_decode",proposer="ngram",reason="length"} 2
specdec_requests_total{model="spec_decode",proposer="ngram",reason="eos"} 1
specdec_output_tokens_total{model="spec_decode",proposer="none"} 50
nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 1e9
"""


def test_prometheus_counters_parse_and_difference():
    after = parse_prometheus(METRICS)
    before = parse_prometheus(METRICS.replace("} 30", "} 10").replace('reason="eos"} 1', 'reason="eos"} 0'))
    c = proposer_counters(delta(before, after), "ngram")
    assert (c.draft_tokens, c.accepted_tokens, c.drafts, c.requests) == (20, 0, 0, 1)
    full = proposer_counters(after, "ngram")
    assert full.requests == 3 and full.accepted_per_position == [6, 4] and full.drafted_per_position == [7, 7]
    assert proposer_counters(after, "none").output_tokens == 50


def test_server_processes_are_named_by_model():
    stub = ["/x/triton_python_backend_stub", "/repo/model_repository/draft/1/model.py", "shm", "1"]
    assert process_name(stub) == "draft"
    assert process_name(["/opt/tritonserver/bin/tritonserver", "--model-repository=/r"]) == "tritonserver"
