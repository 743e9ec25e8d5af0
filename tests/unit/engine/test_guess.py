"""The engine's guess head: the token it guesses, where it is asked for, and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support.models import BF16_OPS_PARAMS, TINY, needs_bf16, write_guess_head

from specdec.build.guess_head import TrainOptions, code_functions, examples, fit
from specdec.client.workloads import WorkloadOptions, load_workload
from specdec.config import REPO_ROOT
from specdec.engine.engine import Engine, GenerationRequest, RequestError
from specdec.engine.guess import MAX_GUESSES, OwnTokens
from specdec.engine.ops import BF16_OPS


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("guess") / "head.safetensors"
    return path, write_guess_head(path)


def expected_guesses(engine: Engine, weights: dict, sequence: list[int], margin: float) -> list[int]:
    """By hand: the head over the last token's row of a prefill of the sequence without its last
    token, scored against the frequent candidates and the sequence's own tokens: the best, then
    the others within the margin, best first."""
    model, n = engine.model, len(sequence) - 1
    slot = torch.full((n,), 1)
    h = model.hidden(engine.cache, torch.tensor(sequence[:-1]), torch.arange(n), slot, torch.tensor([n - 1]))
    e = model.embedding(torch.tensor(sequence[-1:]))
    x = torch.cat([h, e], dim=1)
    z = h + torch.nn.functional.silu(x @ weights["fc1.weight"].T + weights["fc1.bias"]) @ weights["fc2.weight"].T
    z = z + weights["fc2.bias"]
    candidates = sorted(set(weights["candidates"].tolist()) | set(sequence))
    scores = (z @ model.embedding(torch.tensor(candidates)).T)[0]
    order = scores.argsort(descending=True).tolist()
    return [candidates[i] for i in order if scores[i] >= scores[order[0]] - margin][:MAX_GUESSES]


@pytest.mark.parametrize("draft", [None, [3, 4, 5]], ids=["step", "verification"])
@pytest.mark.parametrize("margin", [0.0, 1e3])
def test_the_guesses_are_the_best_scoring_candidate_and_those_within_the_margin(tiny_target, head_file, draft, margin):
    path, weights = head_file
    engine = Engine(tiny_target, kv_slots=2, max_seq_len=64, guess_head=path, guess_margin=margin)
    prompt = np.array([2, 7, 11, 3, 4, 60, 61], dtype=np.int64)
    new = 1 if draft is None else len(draft) + 1
    request = GenerationRequest(prompt, new, None if draft is None else np.array(draft), return_guess=True)
    (result,) = engine.generate([request])
    sequence = [*prompt.tolist(), *result.tokens.tolist()]
    assert result.next_guesses == expected_guesses(engine, weights, sequence, margin)
    every = len(set(weights["candidates"].tolist()) | set(sequence))  # a margin of 1e3 takes them all
    assert len(result.next_guesses) == (1 if margin == 0 else min(every, MAX_GUESSES))
    (plain,) = engine.generate([GenerationRequest(prompt, max_new_tokens=1)])
    assert plain.next_guesses == []  # not asked for


@pytest.fixture(params=BF16_OPS_PARAMS)
def bf16_ops(request, monkeypatch):
    """Each bf16 CPU engine this CPU runs, as dtype bfloat16's choice (the ones before it refused)."""
    for faster in BF16_OPS[: BF16_OPS.index(request.param)]:
        monkeypatch.setattr(faster, "unsupported", staticmethod(lambda: "not this test's"))
    return request.param


def test_the_compiled_head_guesses_what_the_head_through_the_ops_guesses(tiny_target, head_file, bf16_ops):
    """The bf16 engines' one-call kernel (compiled_guesses) against the same head step by step
    through the ops, on random states: the frequent candidates and the contexts' own tokens
    both win some of them, and some have plausible tokens besides the guess."""
    engine = Engine(
        tiny_target, dtype="bfloat16", kv_slots=3, max_seq_len=64, guess_head=head_file[0], guess_margin=2.0
    )
    assert type(engine.model.ops) is bf16_ops
    head = engine.guess_head
    assert head.kernel is not None
    g = torch.Generator().manual_seed(0)
    frequent = own = plausible = 0
    for _ in range(60):
        batch = int(torch.randint(1, 4, (1,), generator=g))
        hidden = torch.randn(batch, TINY["hidden_size"], generator=g) * 4
        tokens = torch.randint(0, TINY["vocab_size"], (batch,), generator=g)
        contexts = [torch.randint(0, TINY["vocab_size"], (n,), generator=g).tolist() for n in range(3, 3 + batch)]
        slots = list(range(batch))
        guesses = head.guesses(hidden, tokens, slots, contexts)
        assert guesses == head._guesses(hidden, tokens, slots)
        for guess, *others in guesses:
            frequent += bool(head.is_candidate[guess])
            own += not head.is_candidate[guess]
            plausible += bool(others)
    assert frequent and own and plausible


def test_own_tokens_are_each_slots_non_candidates_in_the_order_they_first_occur():
    """As sequences grow a few tokens at a time, and as a slot passes to a sequence that does not
    extend its last one: the ids and the rows kept are those of the definition."""
    rng = np.random.default_rng(0)
    vocab, width, slots = 50, 4, 2
    is_candidate = rng.random(vocab) < 0.3
    table = rng.integers(-(2**15), 2**15, (vocab, width), dtype=np.int16)
    own = OwnTokens(slots, 64, is_candidate, table)
    sequences: list[list[int]] = [[] for _ in range(slots)]
    for _ in range(200):
        slot = int(rng.integers(slots))
        if rng.random() < 0.1 or len(sequences[slot]) > 50:  # another request's sequence
            sequences[slot] = rng.integers(vocab, size=int(rng.integers(1, 20))).tolist()
        else:
            sequences[slot] = sequences[slot] + rng.integers(vocab, size=int(rng.integers(0, 4))).tolist()
        ids = own.update(slot, sequences[slot])
        expected = list(dict.fromkeys(t for t in sequences[slot] if not is_candidate[t]))
        assert ids.tolist() == expected
        np.testing.assert_array_equal(own.rows[slot, : len(ids)], table[ids])


@needs_bf16
def test_warmup_compiles_the_guess_kernel(tiny_target, head_file):
    """A server's first guess must not wait for numba to compile (or load) the head's kernel:
    after warmup() alone, in a fresh process, the kernel has its compiled signature."""
    script = (
        "import sys\n"
        "from specdec.engine.guess import compiled_guesses\n"
        "from specdec.engine.engine import Engine\n"
        "engine = Engine(sys.argv[1], dtype='bfloat16', kv_slots=1, max_seq_len=64, guess_head=sys.argv[2])\n"
        "assert not compiled_guesses.signatures\n"
        "engine.warmup()\n"
        "assert compiled_guesses.signatures\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tiny_target), str(head_file[0])], check=True)


def test_asking_an_engine_without_a_head_is_an_error_naming_the_input(tiny_target):
    engine = Engine(tiny_target, kv_slots=1, max_seq_len=64)
    (result,) = engine.generate([GenerationRequest(np.array([2, 3]), return_guess=True)])
    assert isinstance(result, RequestError) and "return_next_guess" in str(result)


def test_a_head_for_another_model_is_refused(tiny_target, tmp_path):
    wrong = {"fc1.weight": torch.zeros(8, 20), "fc1.bias": torch.zeros(8), "fc2.weight": torch.zeros(10, 8),
             "fc2.bias": torch.zeros(10), "candidates": torch.tensor([1])}  # fmt: skip
    save_file(wrong, str(tmp_path / "head.safetensors"))
    with pytest.raises(ValueError, match="hidden size 10"):
        Engine(tiny_target, kv_slots=1, max_seq_len=64, guess_head=tmp_path / "head.safetensors")


def test_training_examples_pair_each_row_with_the_two_tokens_after_it(tiny_target):
    """examples(): row t of a greedy output is the state that produced token t + 1 (its logits'
    argmax), and the example's target is token t + 2."""
    engine = Engine(tiny_target, kv_slots=2, max_seq_len=64)
    prompt = np.array([2, 7, 11, 3], dtype=np.int64)
    (result,) = engine.generate([GenerationRequest(prompt, max_new_tokens=6)])
    output = result.tokens.astype(np.int64)
    h, nxt, target = examples(engine, [(prompt, output)])
    seq = np.concatenate([prompt, output])
    assert nxt.tolist() == seq[len(prompt) : -1].tolist() and target.tolist() == seq[len(prompt) + 1 :].tolist()
    assert engine.model.logits(h).argmax(1).tolist() == nxt.tolist()


def test_fit_learns_a_rule_of_the_next_token():
    """The head learns token t + 2 = token t + 1 plus one, from the token alone (the states are noise)."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(48, 16, generator=g)
    nxt = torch.randint(0, 48, (4096,), generator=g)
    h = torch.randn(4096, 16, generator=g) * 0.1
    head = fit(h, nxt, (nxt + 1) % 48, table, TrainOptions(hidden=64, epochs=15, batch=128, lr=1e-2, weight_decay=0.0))
    with torch.no_grad():
        test = torch.arange(48)
        guessed = (head(torch.zeros(48, 16), table[test]) @ table.T).argmax(1)
    assert (guessed == (test + 1) % 48).float().mean() > 0.9


def test_no_benchmark_prompt_rewrites_a_function_the_head_and_phrases_learn_from():
    """The benchmarks' prompts stay held out from `specdec train-guess-head`'s data: no function
    of its code prompts is one a benchmark prompt asks to rewrite (fnmatch.filter was both)."""
    prompts = REPO_ROOT / "benchmarks" / "prompts"
    workloads = ["grounded", "chat", *map(str, sorted(prompts.glob("*.jsonl")))]
    texts = [p.text for w in workloads for p in load_workload(w, WorkloadOptions())]
    assert len(texts) > 100
    shared = [f.splitlines()[0] for f in code_functions() if any(f.splitlines()[0] in text for text in texts)]
    assert not shared
