"""The spec_decode service in-process, on tiny random-weight models: the draft-verify loop,
both proposers, batching, sampling and cleanup, through the same request parsing and engine
tensors as the served models (specdec.triton.service.local_call)."""

from __future__ import annotations

import asyncio
import itertools
import os

import numpy as np
import pytest
from safetensors.numpy import save_file
from scipy.stats import chisquare
from support.models import write_tiny_llama

from specdec.config import parse_profile
from specdec.contract import SEQUENCE_KEY_INPUT
from specdec.engine.engine import CALIBRATION_CONTEXT, Engine, GenerationRequest
from specdec.engine.sampling import SamplingParams
from specdec.speculation.admission import Overloaded
from specdec.speculation.controller import calibration_path
from specdec.speculation.lookup import Lead
from specdec.speculation.loop import RequestSpec
from specdec.speculation.opening import Opening
from specdec.speculation.phrases import phrase_tokens
from specdec.triton import service as spec_decode
from specdec.triton.service import SpecDecodeService, local_call
from specdec.triton.tensors import InvalidInput, SpecDecodeRequest, parse_engine_call


def make_service(
    target, draft, *, kv_slots=16, max_queue=64, max_inflight=64, build_dir=None, guess_head=None, phrases=None
):
    files = {"guess_head": guess_head, "phrases": phrases}
    ngram = {key: str(path) for key, path in files.items() if path}
    profile = parse_profile(
        {
            "name": "tiny",
            "build_dir": str(build_dir) if build_dir else None,
            "target": {"hf_dir": str(target)},
            "draft": {"hf_dir": str(draft)},
            "engine": {"kv_slots": kv_slots, "max_seq_len": 256, "threads": 1},
            "speculation": {"proposer": "ngram", "num_draft_tokens": 3, "max_draft_tokens": 8, "ngram": ngram},
            "server": {"max_queue": max_queue, "max_inflight": max_inflight},
        }
    )
    engines = {
        "target": Engine(target, kv_slots=kv_slots, max_seq_len=256, threads=1, guess_head=guess_head),
        "draft": Engine(draft, kv_slots=kv_slots, max_seq_len=256, threads=1),
    }
    return SpecDecodeService(profile, local_call(engines)), engines


def request(prompt, max_tokens=24, k=3, proposer="ngram", sampling=None, end_id=None):
    spec = RequestSpec(prompt_ids=list(prompt), max_tokens=max_tokens, num_draft_tokens=k, end_id=end_id)
    return SpecDecodeRequest(spec, sampling or SamplingParams(), proposer, stream=True, seeded=True)


async def tokens_of(service, req, is_cancelled=lambda: False):
    out = []
    async for chunk in service.serve(req, is_cancelled):
        out += chunk.tokens
    return out


def run_all(service, reqs):
    async def main():
        return await asyncio.gather(*(tokens_of(service, r) for r in reqs))

    return asyncio.run(main())


PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7],  # repetitive: prompt lookup finds matches
    [40, 41, 42, 43, 44, 45],
    [3],
    [9, 9, 9, 9, 9, 9, 9, 9],
    list(range(10, 60)),
]


@pytest.fixture(scope="module")
def service(tiny_target, tiny_draft):
    return make_service(tiny_target, tiny_draft)


def reference_greedy(engine: Engine, prompt, n) -> list[int]:
    """The simplest decoder: one token per call, no drafts."""
    seq = list(prompt)
    for _ in range(n):
        (r,) = engine.generate([GenerationRequest(np.array(seq), max_new_tokens=1)])
        seq += r.tokens.tolist()
    return seq[len(prompt) :]


def test_one_engine_call_verifies_each_sequence_as_if_alone(service):
    """A batch of greedy sequences with drafts of different lengths (all right, wrong from the
    second token, none) and a sampled one: each gets the tokens it gets alone."""
    _, engines = service
    target = engines["target"]
    prompts = PROMPTS[:4]
    truth = [reference_greedy(target, p, 5) for p in prompts]
    drafts = [truth[0][:4], [truth[1][0], (truth[1][1] + 1) % 64, truth[1][2]], [], truth[3][:1]]
    calls = [
        GenerationRequest(np.array(p), max_new_tokens=len(d) + 1, draft_ids=np.array(d, dtype=np.int64))
        for p, d in zip(prompts, drafts, strict=True)
    ]
    calls.append(GenerationRequest(np.array(PROMPTS[4]), max_new_tokens=2, sampling=SamplingParams(0.8, 0, 1.0, 7)))
    alone = [target.generate([c])[0] for c in calls]
    together = target.generate(calls)
    assert [r.tokens.tolist() for r in together] == [r.tokens.tolist() for r in alone]
    assert [r.num_accepted for r in together] == [4, 1, 0, 1, 0]
    assert together[0].tokens.tolist() == truth[0][:5] and together[1].tokens.tolist() == truth[1][:2]


def test_greedy_is_exact_for_every_proposer_and_draft_length(service):
    svc, engines = service
    baseline = run_all(svc, [request(p, k=0, proposer="none") for p in PROMPTS])
    for p, base in zip(PROMPTS, baseline, strict=True):
        assert base == reference_greedy(engines["target"], p, len(base))
    for proposer, k in itertools.product(["ngram", "draft_model"], [1, 3, 5, 8]):
        got = run_all(svc, [request(p, k=k, proposer=proposer) for p in PROMPTS])
        assert got == baseline, f"{proposer} k={k}"


def test_many_requests_in_flight_share_forward_passes_and_stay_exact(service):
    svc, engines = service
    alone = [run_all(svc, [request(p, k=4, proposer="draft_model")])[0] for p in PROMPTS]
    engines["target"].max_batch_seen = engines["draft"].max_batch_seen = 0
    together = run_all(svc, [request(p, k=4, proposer="draft_model") for p in PROMPTS * 2])
    assert together == alone * 2
    assert engines["target"].max_batch_seen > 1 and engines["draft"].max_batch_seen > 1


def record_engine_calls(svc, note) -> None:
    """Show note(model, inputs) every engine call of the service but the stop calls, then make it."""
    inner = svc.target.prepare

    def recording(model, inputs, outputs, request_id):
        if "stop" not in inputs:
            note(model, inputs)
        return inner(model, inputs, outputs, request_id)

    svc.target.prepare = svc.draft.prepare = recording


def test_every_call_of_an_engine_carries_the_same_inputs(tiny_target, tiny_draft):
    """Triton's dynamic batcher batches calls of a model with optional inputs only when they carry
    the same ones: a drafted call and an undrafted one must not differ in their input names."""
    svc, _ = make_service(tiny_target, tiny_draft)
    names = {"target": set(), "draft": set()}
    record_engine_calls(svc, lambda model, inputs: names[model].add(tuple(sorted(inputs))))
    sampled = SamplingParams(temperature=0.8, seed=3)
    reqs = [request(p, k=k, proposer=proposer) for p in PROMPTS[:2] for k, proposer in ((4, "ngram"), (0, "none"))]
    reqs += [request(PROMPTS[0], proposer="draft_model"), request(PROMPTS[1], proposer="draft_model", sampling=sampled)]
    run_all(svc, reqs)
    assert len(names["target"]) == 1 and len(names["draft"]) == 1, names
    assert {"draft_input_ids", "draft_logits", "return_generation_logits"} <= set(next(iter(names["target"])))


def in_step_service(target, draft, build_dir, monkeypatch, **options):
    """make_service whose forward rows cost little more than one: the requests in flight wait
    for each other (specdec/speculation/lockstep.py), so a round's calls are sent together."""
    monkeypatch.setattr(spec_decode, "COST_CHECK_S", 0.0)
    calibration_path(build_dir, "target").parent.mkdir(parents=True)
    calibration_path(build_dir, "target").write_text('{"rows": [1, 64], "seconds": [0.01, 0.012]}')
    return make_service(target, draft, build_dir=build_dir, **options)


def test_a_round_in_step_reaches_the_target_as_one_call_of_a_row_per_sequence(
    tiny_target, tiny_draft, tmp_path, monkeypatch
):
    """Sent one by one, the calls of 16 sequences reached the served engine over more than its
    batcher's delay and split into two forward passes; sent as one call they share one, and
    each sequence still gets exactly what it gets alone."""
    svc, engines = in_step_service(tiny_target, tiny_draft, tmp_path, monkeypatch)
    rows = []
    record_engine_calls(svc, lambda model, inputs: rows.append(len(inputs["input_ids"])) if model == "target" else None)
    # calls with an end_id and calls without carry the same inputs (-1: none): they share a call
    reqs = [request(p, k=k, end_id=0 if k else None) for p in PROMPTS for k in (0, 4)]
    together = run_all(svc, reqs)
    assert max(rows) == len(reqs)  # the first round: the prefills, in one call
    assert sum(n > 1 for n in rows) > len(rows) // 2
    for req, got in zip(reqs, together, strict=True):
        assert got == reference_greedy(engines["target"], req.spec.prompt_ids, len(got))


def test_calls_that_ask_for_the_guess_and_calls_that_do_not_share_a_call(
    tiny_target, tiny_draft, tiny_guess_head, tmp_path, monkeypatch
):
    """A request that may not draft does not ask for the engine's guess; its calls still leave
    with those of requests that do: asking for other outputs, they went as a second call into a
    second forward."""
    svc, engines = in_step_service(tiny_target, tiny_draft, tmp_path, monkeypatch, guess_head=tiny_guess_head)
    asked = []  # each target call's rows: which asked for the guess

    def note(model, inputs):
        if model == "target":
            asked.append(inputs["return_next_guess"].ravel().tolist())

    record_engine_calls(svc, note)
    reqs = [request(p, k=k) for p in PROMPTS for k in (0, 4)]
    together = run_all(svc, reqs)
    assert any(True in rows and False in rows for rows in asked), asked
    for req, got in zip(reqs, together, strict=True):
        assert got == reference_greedy(engines["target"], req.spec.prompt_ids, len(got))


def test_a_row_that_fails_fails_its_own_sequence_only(tiny_target, tiny_draft):
    svc, _ = make_service(tiny_target, tiny_draft)
    rows = []
    record_engine_calls(svc, lambda model, inputs: rows.append(len(inputs["input_ids"])))
    fits, too_long = PROMPTS[1], [5] * 300  # the context holds 256 tokens
    greedy = SamplingParams()
    calls = [svc.target.prepare_generate(p, 1, greedy, f"row-{i}", None) for i, p in enumerate((fits, too_long))]

    async def main():
        sent = svc.target.send_together(calls)
        assert not any(isinstance(s, Exception) for s in sent)
        return await asyncio.gather(*sent, return_exceptions=True)

    ok, failed = asyncio.run(main())
    assert rows == [2]  # one call
    assert isinstance(ok, spec_decode.EngineReply) and len(ok.ids) == 1
    assert isinstance(failed, spec_decode.EngineError) and "256" in str(failed)


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ({"input_ids": np.zeros((2, 3), np.int32), "end_id": np.ones((1, 1), np.int32)}, "end_id"),
        ({"input_ids": np.zeros((2, 3), np.int32), "stop": np.ones((2, 1), bool)}, "stop"),
    ],
)
def test_a_call_of_several_rows_is_refused_where_its_rows_disagree(inputs, field):
    with pytest.raises(InvalidInput, match=f"^{field}"):
        parse_engine_call(inputs, "id")


def test_each_row_of_a_call_names_its_sequence_and_ends_its_draft_at_minus_one():
    call = parse_engine_call(
        {
            "input_ids": np.array([[1, 2, 0], [3, 4, 5]], np.int32),
            "input_lengths": np.array([[2], [3]], np.int32),
            "request_output_len": np.array([[2], [1]], np.int32),
            "draft_input_ids": np.array([[9, -1], [-1, -1]], np.int32),
            SEQUENCE_KEY_INPUT: np.array([[b"a"], [b"b"]], object),
        },
        "id",
    )
    first, second = call.requests
    assert (first.input_ids.tolist(), first.draft_ids.tolist(), first.sequence_key) == ([1, 2], [9], "a")
    assert (second.input_ids.tolist(), second.draft_ids, second.sequence_key) == ([3, 4, 5], None, "b")


def test_a_row_with_end_id_minus_one_has_no_end_token():
    call = parse_engine_call(
        {"input_ids": np.array([[1, 2], [3, 4]], np.int32), "end_id": np.array([[-1], [7]], np.int32)}, "id"
    )
    assert [r.end_id for r in call.requests] == [None, 7]


def test_prompt_lookup_starts_drafting_after_the_prefill(tiny_target, tiny_draft):
    """The prompt's tail repeats inside it, so lookup would match there; yet the prefill round
    carries no draft (what follows a prompt is not in it) and later rounds do, their match
    lengths told to the controller."""
    svc, _ = make_service(tiny_target, tiny_draft)
    drafts = []
    record_engine_calls(svc, lambda model, inputs: drafts.append(inputs["draft_input_ids"].shape[1]))
    prompt = [5, 6, 7, 8, 5, 6, 7]
    assert svc.ngram.propose(np.array(prompt), 3).tolist() == [8, 5, 6]
    (tokens,) = run_all(svc, [request(prompt, max_tokens=24, k=3, proposer="ngram")])
    assert tokens == run_all(svc, [request(prompt, max_tokens=24, k=0, proposer="none")])[0]
    assert drafts[0] == 0 and any(drafts[1:]), drafts
    # the controller heard how long each draft's match was
    assert {proposer for proposer, recent in svc.controller.recent.items() if recent.first_by_evidence} == {"ngram"}


def test_the_prefill_round_drafts_the_users_texts_opening_and_greedy_stays_exact(tiny_target, tiny_draft):
    """With an Opening (here: token 90 frames the user's text, token 91 ends a line, 92 ends it
    with a blank line), the first call carries the text after the blank line as its draft, the
    controller counts it by its own evidence, and the output is plain decoding's."""
    svc, _ = make_service(tiny_target, tiny_draft)
    trailing, only_newlines = np.zeros(96, dtype=int), np.zeros(96, dtype=bool)
    trailing[91], trailing[92], only_newlines[92] = 1, 1, True
    svc.opening = Opening([90], [90], trailing, only_newlines)
    prompts = [[90, 7, 8, 91, 92, *range(20, 32), 90], [90, 5, 6, 7, 91, 92, 40, 41, 42, 90], [90, 3, 4, 90]]
    firsts = []
    record_engine_calls(svc, lambda model, inputs: firsts.append(inputs["draft_input_ids"][0].tolist()))
    baseline = run_all(svc, [request(p, k=0, proposer="none") for p in prompts])
    for k in (1, 3, 8):
        firsts.clear()
        outputs = [run_all(svc, [request(p, k=k)])[0] for p in prompts]  # one at a time: the first call is the prefill
        assert outputs == baseline, f"k={k}"
        drafts = [d for d in firsts if d]
        assert list(range(20, 32))[:k] in drafts and [40, 41, 42][:k] in drafts, firsts  # (not into the frame)
    assert Lead.OPENING in svc.controller.recent["ngram"].first_by_evidence


def test_guesses_lead_drafts_where_lookup_matches_little_and_greedy_stays_exact(
    tiny_target, tiny_draft, tiny_guess_head
):
    """With a guess head, every target call asks for the guess (the same inputs for all), drafts
    led by guesses are verified like any other, and the output is plain decoding's."""
    svc, _ = make_service(tiny_target, tiny_draft, guess_head=tiny_guess_head)
    names, asked = set(), []

    def note(model, inputs):
        if model == "target":
            names.add(tuple(sorted(inputs)))
            asked.append(bool(inputs["return_next_guess"].item()))

    record_engine_calls(svc, note)
    baseline = run_all(svc, [request(p, k=0, proposer="none") for p in PROMPTS])
    assert run_all(svc, [request(p, k=0) for p in PROMPTS]) == baseline
    assert not any(asked)  # a request that may not draft never pays for a guess
    for k in (1, 3, 8):
        assert run_all(svc, [request(p, k=k) for p in PROMPTS]) == baseline, f"k={k}"
    assert len(names) == 1 and "return_next_guess" in next(iter(names))
    assert any(asked) and Lead.GUESS in svc.controller.recent["ngram"].first_by_evidence  # drafts led by a guess


def test_phrases_of_the_models_own_outputs_lead_drafts_and_greedy_stays_exact(tiny_target, tiny_draft, tmp_path):
    """A phrase index of the target's own greedy outputs (here, of the same prompts: its phrases
    are then right): drafts come from it where lookup matches little, and are accepted."""
    svc, _ = make_service(tiny_target, tiny_draft)
    baseline = run_all(svc, [request(p, k=0, proposer="none") for p in PROMPTS])
    pairs = [(np.asarray(p), np.asarray(out)) for p, out in zip(PROMPTS, baseline, strict=True)]
    save_file({"tokens": phrase_tokens(pairs)}, str(tmp_path / "phrases.safetensors"))
    svc, _ = make_service(tiny_target, tiny_draft, phrases=tmp_path / "phrases.safetensors")
    for k in (1, 3, 8):
        assert run_all(svc, [request(p, k=k) for p in PROMPTS]) == baseline, f"k={k}"
    phrased = svc.controller.recent["ngram"].first_by_evidence[Lead.PHRASE]
    assert phrased.hits > 0  # a phrase's first token was accepted
    # where the plan would not draft a phrase, the index is not searched
    searches, search = [], svc.phrases.draft
    svc.phrases.draft = lambda tokens: searches.append(1) or search(tokens)
    svc.controller.would_draft = lambda key, evidence: evidence != Lead.PHRASE
    assert run_all(svc, [request(p, k=8) for p in PROMPTS]) == baseline
    assert not searches


def test_caches_are_released_when_requests_end(service):
    svc, engines = service
    run_all(svc, [request(p, proposer="draft_model") for p in PROMPTS])
    assert engines["target"].slots.in_use == 0 and engines["draft"].slots.in_use == 0


def test_cancellation_stops_within_a_round_and_releases(service):
    svc, engines = service
    seen = []

    async def main():
        async for chunk in svc.serve(
            request(PROMPTS[1], max_tokens=200, k=2, proposer="draft_model"), lambda: bool(seen)
        ):
            seen.append(chunk)

    asyncio.run(main())
    assert len(seen) == 2 and seen[1].tokens == [] and seen[1].final
    assert seen[1].gen.finish_reason == "cancelled" and seen[1].gen.stats.rounds == 1
    assert engines["target"].slots.in_use == 0 and engines["draft"].slots.in_use == 0


def test_end_id_stops_generation(service):
    svc, _ = service
    base = run_all(svc, [request(PROMPTS[4], k=0, proposer="none")])[0]
    stop_at = base[5]
    for proposer in ("none", "ngram", "draft_model"):
        got = run_all(svc, [request(PROMPTS[4], proposer=proposer, end_id=stop_at)])[0]
        assert got == base[: base.index(stop_at)]


def test_admission_refuses_beyond_the_queue_bound(tiny_target, tiny_draft):
    svc, _ = make_service(tiny_target, tiny_draft, max_inflight=1, max_queue=1)
    reqs = [request(PROMPTS[4], max_tokens=20, k=0, proposer="none") for _ in range(4)]

    async def main():
        return await asyncio.gather(*(tokens_of(svc, r) for r in reqs), return_exceptions=True)

    results = asyncio.run(main())
    refused = [r for r in results if isinstance(r, Overloaded)]
    served = [r for r in results if isinstance(r, list)]
    assert len(refused) == 2 and len(served) == 2 and served[0] == served[1]


# --- sampling ---------------------------------------------------------------------------------------
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=2024)


def test_a_seed_reproduces_the_output(service):
    svc, _ = service
    for proposer in ("none", "ngram", "draft_model"):
        a, b = run_all(svc, [request(PROMPTS[0], proposer=proposer, sampling=SAMPLED)] * 2)
        assert a == b, proposer


def test_a_deterministic_proposer_gives_the_tokens_of_plain_sampling_for_a_seed(service):
    """For one-hot q the rejection sampler is coupled to the target's own draw (verify.py):
    with the same seed, speculation changes nothing, token for token."""
    svc, _ = service
    for p in PROMPTS:
        base = run_all(svc, [request(p, k=0, proposer="none", sampling=SAMPLED)])[0]
        for k in (1, 4, 8):
            assert run_all(svc, [request(p, k=k, proposer="ngram", sampling=SAMPLED)])[0] == base


def _first_two_tokens(tmp_path, n=3000):
    """A model small enough to enumerate: the exact distribution of its first two tokens, and
    n speculative samples drawn with a stochastic draft (draft logits passed, q not one-hot)."""
    vocab = 6
    # small weights: flat distributions (p of the first token ~ [.29 .09 .12 .16 .06 .29]),
    # and a draft that overlaps the target by about half
    target = write_tiny_llama(tmp_path / "t", seed=3, vocab_size=vocab, scale=0.3)
    draft = write_tiny_llama(tmp_path / "d", seed=4, vocab_size=vocab, num_hidden_layers=1, scale=0.3)
    svc, engines = make_service(target, draft, kv_slots=64)
    prompt = [1, 2, 3]
    eng = engines["target"]
    p1 = _softmax(eng.model.forward(eng.cache, *_rows(prompt, 0))[-1].numpy())
    exact = np.array(
        [p1[t] * _softmax(eng.model.forward(eng.cache, *_rows([*prompt, t], 0))[-1].numpy()) for t in range(vocab)]
    )
    reqs = [
        request(prompt, max_tokens=2, k=2, proposer="draft_model", sampling=SamplingParams(1.0, seed=s))
        for s in range(n)
    ]
    samples, accepted, drafted = [], 0, 0
    for batch in _chunks(reqs, 100):

        async def main(batch=batch):
            return await asyncio.gather(*(_serve_all(svc, r) for r in batch))

        for tokens, gen in asyncio.run(main()):
            samples.append(tokens)
            accepted, drafted = accepted + gen.stats.accepted_tokens, drafted + gen.stats.draft_tokens
    observed = np.zeros((vocab, vocab))
    for t1, t2 in samples:
        observed[t1, t2] += 1
    return observed, exact, accepted / drafted


async def _serve_all(svc, req):
    tokens, gen = [], None
    async for chunk in svc.serve(req):
        tokens += chunk.tokens
        gen = chunk.gen
    return tokens, gen


def test_sampled_draft_model_speculation_has_the_target_distribution(tmp_path):
    """Chi-square of 3000 speculative samples of (t1, t2) against the enumerated distribution."""
    observed, exact, acceptance = _first_two_tokens(tmp_path)
    assert 0.1 < acceptance < 0.9  # drafts are both accepted and rejected: both paths are tested
    assert chisquare(observed.reshape(-1), exact.reshape(-1) * observed.sum()).pvalue > 1e-3


def test_the_distribution_test_catches_a_sampler_that_ignores_q(tmp_path, monkeypatch):
    """Accepting every draft token (as if p == q) must fail the same test."""
    import specdec.engine.engine as engine_module

    real = engine_module.verify.rejection_sample

    def accept_all(target, draft, num_draft, draft_probs, uniform, sample_uniform):
        return real(target, draft, num_draft, draft_probs, uniform * 0, sample_uniform)

    monkeypatch.setattr(engine_module.verify, "rejection_sample", accept_all)
    observed, exact, acceptance = _first_two_tokens(tmp_path)
    assert acceptance == 1.0
    assert chisquare(observed.reshape(-1), exact.reshape(-1) * observed.sum()).pvalue < 1e-6


def _rows(tokens, slot):
    import torch

    n = len(tokens)
    return (torch.tensor(tokens), torch.arange(n), torch.full((n,), slot), torch.arange(n))


def _softmax(x):
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def _chunks(items, size):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def test_the_controller_follows_the_costs_the_engines_publish(tiny_target, tiny_draft, tmp_path, monkeypatch):
    """Engines record every forward's rows and time; the table they publish (calibration at
    start-up, then kept current) is what the controller decides with, each new version picked up."""
    monkeypatch.setattr(spec_decode, "COST_CHECK_S", 0.0)
    service, engines = make_service(tiny_target, tiny_draft, build_dir=tmp_path)
    path = calibration_path(tmp_path, "target")
    path.parent.mkdir(parents=True)
    path.write_text('{"rows": [1, 8], "seconds": [0.01, 0.02]}')
    run_all(service, [request(PROMPTS[4], max_tokens=4)])
    assert service.controller.target.seconds == [0.01, 0.02]
    prompt_rows, first_seconds, alone, sequences = engines["target"].recent_forwards[0]
    assert prompt_rows == len(PROMPTS[4]) and first_seconds > 0 and alone and sequences == 1
    path.write_text('{"rows": [1, 8], "seconds": [0.03, 0.05], "shape": {"8": 0.5}}')
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 10))
    run_all(service, [request(PROMPTS[0], max_tokens=4)])
    assert service.controller.target.seconds == [0.03, 0.05] and service.controller.target.shape == {8: 0.5}
    # a forward while another sequence holds a slot is not alone: it teaches the cost no shape
    target = engines["target"]
    target.generate([GenerationRequest(np.array(PROMPTS[0]), max_new_tokens=1, sequence_key="other")])
    target.generate([GenerationRequest(np.array(PROMPTS[4]), max_new_tokens=1)])
    assert target.recent_forwards[-1][2] is False
    target.release("other")
    target.generate([GenerationRequest(np.array(PROMPTS[4]), max_new_tokens=1)])
    assert target.recent_forwards[-1][2] is True


def test_calibration_times_every_row_count_asked_for_and_leaves_the_slots_free(tiny_target, tmp_path):
    engine = Engine(tiny_target, kv_slots=1, max_seq_len=64, threads=1, lock_file=tmp_path / "engine.lock")
    table = engine.calibrate(rows=(1, 2, 9, 64), repeats=2)
    assert table["rows"] == [1, 2, 9]  # 64 rows do not fit a 64-token sequence
    assert all(0 < s < 10 for s in table["seconds"])
    assert engine.slots.in_use == 0


def test_a_calibration_is_measured_once_per_key_then_reused(tiny_target, tiny_draft, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    engine = Engine(tiny_target, kv_slots=1, max_seq_len=64, threads=1)
    measured = []
    calibrate = engine.calibrate
    monkeypatch.setattr(engine, "calibrate", lambda *a, **kw: measured.append(a) or calibrate(*a, **kw))
    first = engine.calibrated(cache, rows=(1, 2), repeats=1)
    assert engine.calibrated(cache, rows=(1, 2), repeats=1) == first and len(measured) == 1
    # what a forward's time depends on is in the key: other rows, another model's shapes, a cache as long
    engine.calibrated(cache, rows=(1, 3), repeats=1)
    assert len(measured) == 2
    keys = {Engine(model, kv_slots=slots, max_seq_len=64, threads=1).calibration_key((1, 2), 1)
            for model, slots in ((tiny_target, 1), (tiny_draft, 1), (tiny_target, 2))}  # fmt: skip
    assert len(keys) == 3 and engine.calibration_key((1, 2), 1) in keys
    (cache / f"{engine.calibration_key((1, 2), 1)}.json").write_text("{not json")  # a broken entry: measured again
    assert engine.calibrated(cache, rows=(1, 2), repeats=1)["rows"] == [1, 2] and len(measured) == 3
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".json"]  # nothing staged is left


def test_calibrated_rows_follow_a_context_as_a_verifications_do(tiny_target, monkeypatch):
    engine = Engine(tiny_target, kv_slots=1, max_seq_len=2048, threads=1)
    first_positions = []
    timed = engine._timed_forward
    monkeypatch.setattr(
        engine, "_timed_forward", lambda *args, **kw: (first_positions.append(int(args[1][0])), timed(*args, **kw))[1]
    )
    table = engine.calibrate(rows=(1, 9), repeats=2)
    assert table["rows"] == [1, 9]
    assert first_positions[0] == 0  # the context, written once
    assert set(first_positions[1:]) == {CALIBRATION_CONTEXT}
    assert len(first_positions) == 1 + 2 * 3  # each pass: an untimed forward, then each count


def test_what_rounds_take_beyond_their_forwards_reaches_the_controller(tiny_target, tiny_draft, tmp_path, monkeypatch):
    monkeypatch.setattr(spec_decode, "COST_CHECK_S", 0.0)
    service, _ = make_service(tiny_target, tiny_draft, build_dir=tmp_path)
    path = calibration_path(tmp_path, "target")
    path.parent.mkdir(parents=True)
    path.write_text('{"rows": [1, 64], "seconds": [1e-9, 1e-9]}')  # forwards priced at nothing
    assert service.controller.overhead_s == 0.0
    run_all(service, [request(PROMPTS[4], max_tokens=8)])
    assert service.controller.overhead_s > 0  # so the rounds' whole time is overhead


def _end_ids(engines, prompt):
    """An end id the target writes early after `prompt` (its greedy tokens, from the third on)."""
    return reference_greedy(engines["target"], prompt, 8)[2]


def test_min_length_keeps_the_end_token_out_and_speculation_exact(service):
    """With min_tokens the end token is out of the first min_tokens positions (its logit -inf
    there), in every proposer's rounds alike: the tokens equal plain decoding's under the same
    rule, and the request ends at the end token only after them."""
    svc, engines = service
    prompt = PROMPTS[0]
    end_id = _end_ids(engines, prompt)
    plain = run_all(svc, [request(prompt, 16, k=0, proposer="none", end_id=end_id)])[0]
    assert len(plain) == 2  # without min_length the request ends at its third token

    def with_min(k, proposer, min_tokens):
        spec = RequestSpec(list(prompt), 16, k, end_id=end_id, min_tokens=min_tokens)
        return run_all(svc, [SpecDecodeRequest(spec, SamplingParams(), proposer, stream=True, seeded=True)])[0]

    held = with_min(0, "none", 6)
    assert len(held) >= 6 and end_id not in held[:6]
    for proposer, k in itertools.product(["ngram", "draft_model"], [1, 4]):
        assert with_min(k, proposer, 6) == held, (proposer, k)
    (alone,) = engines["target"].generate([GenerationRequest(np.array(prompt), 6, end_id=end_id, min_tokens=6)])
    assert alone.tokens.tolist() == held[:6]
