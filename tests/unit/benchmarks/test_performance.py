"""benchmarks/performance.py: docs/performance.md is what the results in the tree give, and a
results folder becomes a section a benchmark with its command, machine and tables."""

from __future__ import annotations

import json

import performance
from performance import DOC, RESULTS, render, update

MACHINE = {"cpu": "Test CPU", "logical_cores": 4, "memory_gib": 8.0, "gpus": [], "load_average": [0.5, 0.4, 0.3]}


def test_the_document_is_what_the_results_in_the_tree_give():
    assert DOC.is_file(), "docs/performance.md is missing: run .venv/bin/python benchmarks/performance.py"
    assert DOC.read_text() == render(), "docs/performance.md differs: run .venv/bin/python benchmarks/performance.py"


def test_each_script_that_writes_results_has_a_folder_of_its_own():
    folders = {path.name for path in RESULTS.iterdir() if path.is_dir()}
    assert folders == {script for script, _, _ in performance.SECTIONS}


def test_the_defaults_it_leaves_out_of_a_command_are_the_scripts():
    import soak
    from targets import CONCURRENCY

    assert performance.TARGETS_CONCURRENCY == CONCURRENCY
    soak_defaults = soak.parser().parse_args([])
    given = {"max_tokens": soak_defaults.max_tokens, "warmup_requests": soak_defaults.warmup,
             "sample_every": soak_defaults.sample_every,
             "max_slope_bytes_per_request": soak_defaults.max_slope}  # fmt: skip
    assert given == performance.SOAK_DEFAULTS
    import draft_length
    import edge_overhead

    lengths = draft_length.parser().parse_args([])
    given = {"lengths": lengths.lengths, "num_requests": lengths.num_requests, "max_tokens": lengths.max_tokens}
    assert given == performance.DRAFT_LENGTH_DEFAULTS
    edge = edge_overhead.parser().parse_args([])
    given = {"blocks": edge.blocks, "requests": edge.requests, "concurrency": edge.concurrency,
             "max_tokens": edge.max_tokens}  # fmt: skip
    assert given == performance.EDGE_DEFAULTS
    import startup

    assert {"rounds": startup.parser().parse_args([]).rounds} == performance.STARTUP_DEFAULTS


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_results_folder_gives_a_section_a_benchmark(tmp_path):
    results, doc = tmp_path / "benchmarks" / "results", tmp_path / "docs" / "performance.md"
    level = {"workload": "grounded", "prompts": "mine.jsonl", "concurrency": 1}
    _write(results / "targets" / "targets.json",
           json.dumps({"machine": MACHINE, "decoding": "temperature 0.7, top_p 0.9", "levels": [level]}))  # fmt: skip
    _write(results / "targets" / "targets.md", "Machine: Test CPU.\n\n| figure |\n|---|\n\n![ratios](targets.png)\n")
    _write(results / "copy_bound" / "copy_bound.md", "Machine: Other CPU, 2 cores. Forward ms.\n\n| task |\n")
    _write(results / "copy_bound" / "copy_bound.json",
           json.dumps({"tasks": [{"kind": "code"}, {"kind": "held.jsonl (all)"}]}))  # fmt: skip
    slopes = {"rss": 12.0, "anon": 10.0, "file": 2.0, "shmem": 0.0}
    memory = {"warmup_requests": 4, "sample_every": 2, "max_slope_bytes_per_request": 1024,
              "slopes_bytes_per_request": {"edge": slopes}, "samples": []}  # fmt: skip
    soak = {"machine": MACHINE, "requests": 10, "concurrency": 2, "max_tokens": 16,
            "outcomes": {"greedy (text): as expected": 10},
            "unexpected": [], "memory": memory, "kv_slots_in_use_at_end": 0.0, "failures": []}  # fmt: skip
    _write(results / "soak" / "soak.json", json.dumps(soak))
    rows = [{"arm": arm, "requests": "8"} for arm in ("baseline", "ngram:4", "ngram:12")]
    _write(results / "draft_length" / "draft_length.json", json.dumps({"machine": MACHINE, "rows": rows}))
    _write(results / "draft_length" / "draft_length.md", "One user, 128 tokens at most.\n\nMachine: Test CPU.\n")
    gpu = {
        "machine": {**MACHINE, "gpus": ["NVIDIA H100, 81559 MiB"]}, "torch": "2.5", "device": "NVIDIA H100",
        "dtype": "torch.bfloat16", "seconds": 120.0,
        "model": {"shape": {"num_hidden_layers": 30}, "weights": "random", "draft_layers": 4},
        "exactness": {"all_exact": True, "checks": [{"exact": True}, {"exact": True}]},
        "verification_cost": {"rows": [1, 2], "seconds": [0.01, 0.011], "relative_to_one_row": [1.0, 1.1]},
        "throughput": [{"requests": 1, "proposer": "none", "tokens_per_s": 50.0, "acceptance": 0.0},
                       {"requests": 1, "proposer": "ngram", "tokens_per_s": 100.0, "acceptance": 0.5, "speedup": 2.0}],
    }  # fmt: skip
    _write(results / "gpu_check" / "gpu_check.json", json.dumps(gpu))

    text = render(results, doc)
    targets, readme, copy_bound, crosscheck, soak_, draft_length, edge, startup, gpu_check = text.split("\n## ")[1:]
    assert ("`.venv/bin/python benchmarks/targets.py --grounded mine.jsonl --concurrency 1 --temperature 0.7 "
            "--top-p 0.9`") in targets  # fmt: skip
    assert "- Ran on: Test CPU, 4 cores, 8.0 GiB, no GPU, 1-minute load average 0.5 when written" in targets
    assert "![ratios](../benchmarks/results/targets/targets.png)" in targets  # the report's image, from docs/
    assert "No run in benchmarks/results/readme/ yet." in readme
    assert "`.venv/bin/python benchmarks/copy_bound.py --workload held.jsonl`" in copy_bound
    assert "- Ran on: Other CPU, 2 cores" in copy_bound and "| task |" in copy_bound
    assert "No run in benchmarks/results/crosscheck/ yet." in crosscheck
    assert ("`.venv/bin/python benchmarks/soak.py --requests 10 --concurrency 2 --max-tokens 16 --warmup 4 "
            "--sample-every 2`"
            in soak_)  # fmt: skip
    assert "| greedy (text): as expected | 10 |" in soak_ and "| edge | +12 | +10 | +2 | +0 |" in soak_
    assert "`.venv/bin/python benchmarks/draft_length.py --lengths 4,12 --num-requests 8`" in draft_length
    assert "- Ran on: Test CPU" in draft_length
    assert "No run in benchmarks/results/edge_overhead/ yet." in edge
    assert "No run in benchmarks/results/startup/ yet." in startup
    assert "NVIDIA H100, 81559 MiB" in gpu_check and "| 2 | 11.00 | 1.10x |" in gpu_check
    assert "| 1 | ngram | 100.0 | 50% | 2.00x |" in gpu_check
    assert "`python3 benchmarks/gpu_check.py`" in gpu_check


def test_only_a_run_into_the_trees_results_rewrites_the_document(tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr(performance, "write", lambda: written.append(True))
    update(tmp_path)  # a run with --out elsewhere (the tests' own runs)
    assert written == []
    update(RESULTS / "gpu_check")
    assert written == [True]
