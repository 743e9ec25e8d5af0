"""benchmarks/readme.py: the anchor table takes each figure from the run and level it names."""

from __future__ import annotations

from readme import anchor_table


def _summary(rate: float, first_text_s: float, speedup: float | None = None, interval=None, same=(4, 4)) -> dict:
    return {"output_token_throughput": rate, "time_to_first_token": {"p50": first_text_s * 1000}, "speedup": speedup,
            "speedup_interval": interval, "same_text_as_baseline": list(same)}  # fmt: skip


def _run(*levels: tuple[int, dict]) -> dict:
    return {"levels": [{"load": {"concurrency": c}, "summary": arms} for c, arms in levels]}


def test_each_figure_comes_from_its_own_level_and_run():
    streamed = _run(
        (1, {"baseline": _summary(50.0, 0.120), "ngram:15": _summary(125.0, 0.130, 2.5, (2.2, 2.8), (31, 32))}),
        (8, {"baseline": _summary(200.0, 0.900), "ngram:15": _summary(250.0, 0.500, 1.25)}),
    )
    unstreamed = _run((1, {"ngram:15": _summary(130.0, 0.780)}))
    rows = anchor_table(streamed, unstreamed, "ngram:15", 8).splitlines()[2:]
    many, streaming, speedup = (row.split(" | ")[-1] for row in rows)
    assert many == "250.0 tokens/s at 8 users, 2.00x the 125.0 of one user; 1.25x the baseline's 200.0 at 8 users |"
    assert streaming == "first text after 130 ms (p50), against 780 ms for the same requests unstreamed |"
    assert speedup == "2.50x the baseline (95% interval 2.20-2.80x), 125.0 tokens/s; the same text in 31 of 32 |"


def test_a_run_too_short_for_an_interval_gives_the_ratio_alone():
    streamed = _run(
        (1, {"baseline": _summary(50.0, 0.1), "ngram:15": _summary(100.0, 0.1, 2.0, None, (2, 2))}),
        (2, {"baseline": _summary(80.0, 0.2), "ngram:15": _summary(120.0, 0.2, 1.5)}),
    )
    speedup = anchor_table(streamed, _run((1, {"ngram:15": _summary(100.0, 0.5)})), "ngram:15", 2).splitlines()[-1]
    assert speedup.endswith("| 2.00x the baseline, 100.0 tokens/s; the same text in 2 of 2 |")
