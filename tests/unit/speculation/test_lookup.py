from __future__ import annotations

import asyncio

import numpy as np
import pytest
from safetensors.numpy import save_file

from specdec.speculation.lookup import Lead, Lookup, NgramProposer, PromptLookup
from specdec.speculation.opening import Opening
from specdec.speculation.phrases import PhraseIndex, phrase_tokens
from specdec.tokenizer import TextTokenizer


def test_proposes_what_followed_the_longest_earlier_match():
    ngram = NgramProposer(1, 3)
    tokens = np.array([1, 2, 3, 4, 5, 9, 9, 2, 3, 4])
    assert ngram.propose(tokens, 3).tolist() == [5, 9, 9]  # "2 3 4" matched, then 5 9 9


def test_most_recent_occurrence_wins():
    tokens = np.array([7, 1, 7, 2, 7])
    assert NgramProposer(1, 1).propose(tokens, 1).tolist() == [2]


def test_lookup_resumes_at_the_first_match_from_a_point():
    tokens = np.array([7, 1, 7, 2, 7, 3, 7])  # "7" followed by 1, 2, 3: continuations start at 1, 3, 5
    ngram = NgramProposer(1, 1)
    assert ngram.lookup(tokens).start == 5  # the most recent
    assert ngram.lookup(tokens, resume=2).start == 3
    assert ngram.lookup(tokens, resume=6).start == 5  # none from there on: the most recent


def test_matches_lists_every_earlier_occurrence_of_the_longest_suffix():
    tokens = np.array([1, 2, 3, 9, 4, 2, 3, 7, 2, 3])
    starts, n = NgramProposer(1, 3).matches(tokens)
    assert (starts, n) == ([3, 7], 2)  # "2 3" twice; "1 2 3" never
    starts, n = NgramProposer(3, 3).matches(tokens)
    assert (starts, n) == ([], 0)


def longest_suffix_by_definition(corpus, tokens, min_n, max_n):
    """By brute force: the longest n (max_n down to min_n) whose suffix of the tokens is a window of
    the corpus, and where the tokens after each such window start."""
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[len(tokens) - n :].tolist()
        starts = [i + n for i in range(len(corpus) - n + 1) if corpus[i : i + n].tolist() == suffix]
        if starts:
            return starts, n
    return [], 0


def test_matches_agree_with_a_search_of_every_window_on_random_sequences():
    """matches() grows its match from the last token's occurrences; by definition its corpus is
    the sequence before its last token (an occurrence has a token after it)."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        min_n, max_n = int(rng.integers(1, 3)), int(rng.integers(3, 6))
        tokens = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(0, 30)))
        starts, n = NgramProposer(min_n, max_n).matches(tokens.tolist())
        assert (starts, n) == longest_suffix_by_definition(tokens[:-1], tokens, min_n, max_n)


def test_no_match_proposes_nothing():
    assert NgramProposer(2, 3).propose(np.array([1, 2, 3, 4]), 4).tolist() == []


def test_proposal_is_cut_at_the_end_of_the_sequence():
    assert NgramProposer(1, 2).propose(np.array([5, 6, 8, 5, 6]), 5).tolist() == [8, 5, 6]


def test_zero_tokens_and_tiny_sequences():
    ngram = NgramProposer(1, 4)
    assert ngram.propose(np.array([], dtype=np.int64), 4).tolist() == []
    assert ngram.propose(np.array([3]), 4).tolist() == []
    assert ngram.propose(np.array([3, 3]), 0).tolist() == []
    assert ngram.propose(np.array([3, 3]), 2).tolist() == [3]


def test_rejects_bad_bounds():
    with pytest.raises(ValueError):
        NgramProposer(3, 2)


def test_lookup_prefers_the_match_whose_next_token_is_ranked_first():
    """ranked: the engine's plausible next tokens, best first. Of the suffix's occurrences the one
    followed by the best-ranked token wins; a tie (or nothing ranked) goes by resume, then recency."""
    ngram = NgramProposer(1, 4)
    tokens = np.array([9, 5, 1, 9, 5, 2, 9, 5, 3, 9, 5])  # "9 5" followed by 1, 2 and 3
    assert ngram.lookup(tokens) == Lookup(8, 2)  # the most recent: 3
    assert ngram.lookup(tokens, ranked=[2, 1]) == Lookup(5, 2)
    assert ngram.lookup(tokens, ranked=[8, 1]) == Lookup(2, 2)
    assert ngram.lookup(tokens, ranked=[8]) == Lookup(8, 2)  # none ranked: as without
    assert ngram.lookup(tokens, resume=3, ranked=[8]) == Lookup(5, 2)
    assert ngram.lookup(tokens, resume=6, ranked=[1]) == Lookup(2, 2)  # the rank before the resume point


def test_prompt_lookup_gives_its_match_length_and_drafts_from_that_match():
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=6)
    prompt = [1, 2, 3, 4, 5, 9]
    assert lookup.evidence(prompt) == 0  # the prefill round: no lookup in the prompt's own tail
    tokens = [*prompt, 2, 3, 4]
    assert lookup.evidence(tokens) == 3  # "2 3 4" matched
    assert asyncio.run(lookup.propose(tokens, 2)).ids == [5, 9]
    assert lookup.evidence([*prompt, 7]) == 0
    assert asyncio.run(lookup.propose([*prompt, 7], 2)).ids == []


# token texts of a toy vocabulary: 0 "a", 1 "\n", 2 "\n\n", 3 "a\n", 4 "\na", 5 "<user>", 6 "<end>" (special)
TOY_TEXTS = ["a", "\n", "\n\n", "a\n", "\na", "", ""]


def toy_opening() -> Opening:
    trailing = np.array([len(t) - len(t.rstrip("\n")) for t in TOY_TEXTS])
    only_newlines = np.array([bool(t) and not t.strip("\n") for t in TOY_TEXTS])
    return Opening([5], [6, 1], trailing, only_newlines)


@pytest.mark.parametrize(
    ("user_text", "start"),
    [
        ([0, 2, 0, 0], 2),  # a "\n\n" token
        ([0, 1, 1, 0, 0], 3),  # "\n" then "\n"
        ([3, 1, 0], 2),  # "a\n" then "\n"
        ([0, 1, 2, 0, 1, 1, 0], 3),  # the first blank line: "\n" then "\n\n"
        ([0, 1, 4, 1, 0], None),  # "\n" then "\na": the line has text
        ([3, 3, 0], None),  # line ends, no blank line
        ([0, 0, 2], None),  # a blank line that ends the text opens nothing
        ([], None),
    ],
)
def test_an_opening_is_the_users_text_after_its_first_blank_line(user_text, start):
    prompt = [5, *user_text, 6, 1]  # the template's prefix and suffix around the user's text
    span = toy_opening().span(prompt)
    assert span == (None if start is None else (1 + start, 1 + len(user_text)))


def test_a_prompt_outside_the_templates_frame_has_no_opening():
    opening = toy_opening()
    assert opening.span([0, 2, 0, 6, 1]) is None  # no prefix: raw text
    assert opening.span([5, 0, 2, 0]) is None  # no suffix
    assert opening.span([5, 0, 9, 2, 0, 6, 1]) == (4, 5)  # an id past the tokenizer's: no newline


def test_the_prefill_round_drafts_the_opening_up_to_the_users_texts_end_then_the_copy_goes_on():
    prompt = [5, 0, 2, 3, 0, 3, 6, 1]  # the opening: "a\n" "a" "a\n" at 3..5
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt), opening=toy_opening())
    assert lookup.evidence(prompt) == Lead.OPENING
    assert lookup.draft(prompt, 8) == [3, 0, 3]  # not into the template's suffix
    assert lookup.draft(prompt, 2) == [3, 0]
    # the target accepted the two: lookup's next match of "0" goes on from there, not at prompt[1]
    assert lookup.draft([*prompt, 3, 0, 0], 1) == [3]
    assert PromptLookup(NgramProposer(1, 4), len(prompt)).evidence(prompt) == 0  # no opening given


def test_the_opening_of_a_chat_prompt_from_the_real_tokenizer(tokenizer):
    opening = Opening.from_tokenizer(tokenizer)
    passage = "The cat sat on the mat.\n\nIt was warm."
    prompt = tokenizer.prompt_ids(f"Fix the spelling:\n\n{passage}", apply_chat_template=True)
    start, end = opening.span(prompt)
    assert tokenizer.decode(prompt[start:end]) == passage
    assert prompt[end:] == opening.suffix
    assert opening.span(tokenizer.prompt_ids("Fix the spelling: the cat sat.", apply_chat_template=True)) is None
    assert opening.span(tokenizer.prompt_ids(f"Fix this:\n\n{passage}", apply_chat_template=False)) is None


def test_prompt_lookup_over_the_positions_it_keeps_finds_what_a_scan_finds():
    """PromptLookup keeps each token's positions as the sequence grows and hands them to
    NgramProposer.lookup; a lookup that scans the whole sequence each time finds the same."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        ngram = NgramProposer(1, int(rng.integers(1, 5)))
        tokens = rng.integers(0, 6, int(rng.integers(1, 12))).tolist()
        lookup = PromptLookup(ngram, prompt_length=len(tokens))
        for _ in range(int(rng.integers(1, 8))):
            tokens += rng.integers(0, 6, int(rng.integers(1, 4))).tolist()
            assert lookup.find(tokens) == ngram.lookup(tokens), tokens


@pytest.mark.parametrize("template", ["{{ messages[0].content }} {{ messages[0].content }}", "Hello.", None])
def test_no_opening_where_the_template_does_not_write_the_users_text_once_as_it_is(smollm_dir, template):
    tokenizer = TextTokenizer(smollm_dir)
    tokenizer.config = {**tokenizer.config, "chat_template": template}
    assert tokenizer.user_turn() is None
    assert Opening.from_tokenizer(tokenizer) is None


def test_prompt_lookup_goes_on_with_the_copy_it_was_making():
    """The target accepted a draft copied from prompt[1:], then wrote a token of its own; when
    the next suffix (a 5) also occurs later, the copy goes on from where it left off."""
    prompt = [7, 5, 1, 2, 3, 5, 8, 9, 4]
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt))
    assert lookup.draft([*prompt, 7], 1) == [5]  # "7" matched at prompt[0]
    assert lookup.draft([*prompt, 7, 5, 6], 3) == []  # 5 accepted, then 6: no match
    assert lookup.draft([*prompt, 7, 5, 6, 5], 3) == [1, 2, 3]  # the 5 at prompt[1], where the copy was
    fresh = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt))
    assert fresh.draft([*prompt, 7, 5, 6, 5], 3) == [6, 5]  # without it: the most recent 5


def test_a_guess_leads_where_lookup_matches_less_than_two_tokens():
    """heard(): the engine guessed the token after the sequence. Where lookup's match is short,
    the draft is the guess and then what follows the guess's own match; a longer match wins."""
    prompt = [7, 5, 1, 2, 3, 8, 9, 4]
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt))
    tokens = [*prompt, 6]  # 6: no match
    lookup.heard(len(tokens), [1])
    assert lookup.evidence(tokens) == Lead.GUESS
    assert lookup.draft(tokens, 4) == [1, 2, 3, 8]  # the guess 1, then what followed 1 in the prompt
    tokens = [*prompt, 2, 3]  # "2 3" matched: two tokens, no guess
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt))
    lookup.heard(len(tokens), [4])
    assert lookup.evidence(tokens) == 2 and lookup.draft(tokens, 2) == [8, 9]


def test_a_one_token_match_keeps_the_lead_where_the_engine_finds_its_next_token_plausible():
    """The engine's guesses after the first are the other tokens it finds plausible: a one-token
    match whose copy goes on with one of them drafts its copy; otherwise the guess leads."""
    prompt = [7, 5, 1, 2, 3, 8, 9, 4]
    tokens = [*prompt, 1]  # "1" matched at prompt[2]: its copy goes on 2, 3, 8
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt))
    lookup.heard(len(tokens), [9, 2])
    assert lookup.evidence(tokens) == 1 and lookup.draft(tokens, 3) == [2, 3, 8]
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt))
    lookup.heard(len(tokens), [9, 5])
    assert lookup.evidence(tokens) == Lead.GUESS and lookup.draft(tokens, 3) == [9, 4, 1]


def test_a_guess_is_only_for_the_length_it_was_made_for():
    prompt = [7, 5, 1, 2, 3, 8, 9, 4]
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt))
    lookup.heard(len(prompt) + 1, [3])
    assert lookup.draft([*prompt, 6, 6], 3) == [6]  # made for another length: ignored ("6" matched)
    lookup.heard(len(prompt) + 3, [])  # no guess
    assert lookup.evidence([*prompt, 6, 6, 0]) == 0
    lookup.heard(len(prompt) + 4, [99])
    assert lookup.draft([*prompt, 6, 6, 0, 2], 3) == [99]  # nothing follows the guess: itself alone


SEP = PhraseIndex.SEPARATOR


def test_a_phrase_is_the_continuation_most_matches_share_token_by_token():
    """Three answers go on from "1 2 3": all with 4, two of them then with 5, and those two then
    with 6 and 7. The draft goes on while at least min_share of the matches left agree."""
    corpus = np.array([1, 2, 3, 4, 5, 6, SEP, 1, 2, 3, 4, 5, 7, SEP, 1, 2, 3, 4, 8, SEP])
    assert PhraseIndex(corpus, min_n=2, min_share=0.6).draft([0, 1, 2, 3]) == [4, 5]  # 4: 3 of 3, 5: 2 of 3
    assert PhraseIndex(corpus, min_n=2, min_share=0.7).draft([0, 1, 2, 3]) == [4]
    assert PhraseIndex(corpus, min_n=2, min_share=0.5).draft([0, 1, 2, 3]) == [4, 5, 6]  # a tie at half: the lower id
    assert PhraseIndex(corpus, min_n=2, min_share=0.6, max_draft=1).draft([0, 1, 2, 3]) == [4]
    assert PhraseIndex(corpus, min_n=2).draft([9, 4, 5]) == [6]  # "4 5": the longest suffix that occurs


def test_a_phrase_stops_at_the_end_of_its_answer_and_needs_min_n_tokens_of_match():
    corpus = np.array([5, 6, 7, 8, SEP, 1, 6, 7, 8, SEP])
    assert PhraseIndex(corpus, min_n=2).draft([6, 7]) == [8]  # never across the separator
    assert PhraseIndex(corpus, min_n=3).draft([0, 6, 7]) == []  # "6 7" only: two tokens
    assert PhraseIndex(corpus, min_n=3).draft([5, 6, 7]) == [8]
    assert PhraseIndex(corpus, min_n=1).draft([42]) == []


def phrase_by_definition(corpus, tokens, min_n, max_n, min_share, max_draft):
    """PhraseIndex.draft() as its docstring says it: the longest suffix's occurrences, then a token
    at a time the one most of those left share (the lower id in a tie), while at least min_share
    of them agree and it is not the separator."""
    starts, _ = longest_suffix_by_definition(corpus, tokens, min_n, max_n)
    out = []
    while len(out) < max_draft and starts:
        following = [int(corpus[s]) for s in starts]
        best = min(set(following), key=lambda t: (-following.count(t), t))
        if best == SEP or following.count(best) < min_share * len(starts):
            break
        out.append(best)
        starts = [s + 1 for s, t in zip(starts, following, strict=True) if t == best]
    return out


def test_phrases_agree_with_their_definition_on_random_corpora():
    """The index's compiled search from the positions of each run of tokens it keeps drafts what
    the definition drafts."""
    rng = np.random.default_rng(2)
    for _ in range(2000):
        vocab, max_draft = int(rng.integers(2, 5)), int(rng.integers(1, 8))
        answers = [rng.integers(0, vocab, int(rng.integers(0, 12))) for _ in range(int(rng.integers(1, 5)))]
        corpus = np.concatenate([np.append(a, SEP) for a in answers])
        tokens = rng.integers(0, vocab + 1, int(rng.integers(0, 8)))  # (token `vocab` occurs nowhere)
        min_n, min_share = int(rng.integers(1, 5)), float(rng.choice([0.0, 0.5, 0.7]))
        index = PhraseIndex(corpus, min_n=min_n, max_n=6, min_share=min_share, max_draft=max_draft)
        expected = phrase_by_definition(corpus, tokens, min_n, 6, min_share, max_draft)
        assert index.draft(tokens.tolist()) == expected, (corpus.tolist(), tokens.tolist())


def test_phrase_tokens_lead_each_output_with_its_prompts_tail_and_end_it_with_the_separator(tmp_path):
    pairs = [(np.array([1, 2, 3, 4]), np.array([7, 8])), (np.array([5]), np.array([9]))]
    tokens = phrase_tokens(pairs, lead=2)
    assert tokens.tolist() == [3, 4, 7, 8, SEP, 5, 9, SEP]
    save_file({"tokens": tokens}, str(tmp_path / "phrases.safetensors"))
    assert PhraseIndex.load(tmp_path / "phrases.safetensors").draft([3, 4, 7]) == [8]
    save_file({"other": tokens}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a phrase index"):
        PhraseIndex.load(tmp_path / "other.safetensors")


def test_a_phrase_leads_where_lookup_matches_less_than_two_tokens_before_the_guess():
    prompt = [7, 5, 1, 2, 3, 8, 9, 4]
    phrases = PhraseIndex(np.array([4, 6, 10, 11, 12, SEP]), min_n=2)
    lookup = PromptLookup(NgramProposer(1, 4), prompt_length=len(prompt), phrases=phrases)
    tokens = [*prompt, 6]  # "6": no match in the sequence; "4 6" in the phrases
    lookup.heard(len(tokens), [1])
    assert lookup.evidence(tokens) == Lead.PHRASE
    assert lookup.draft(tokens, 2) == [10, 11]
    tokens = [*prompt, 6, 10, 11, 0]  # the phrase accepted, then 0: neither finds anything
    lookup.heard(len(tokens), [1])
    assert lookup.evidence(tokens) == Lead.GUESS and lookup.draft(tokens, 2) == [1, 2]
    unwanted = PromptLookup(NgramProposer(1, 4), len(prompt), phrases=phrases, phrase_wanted=lambda: False)
    tokens = [*prompt, 6]
    unwanted.heard(len(tokens), [1])
    assert unwanted.evidence(tokens) == Lead.GUESS  # the phrase is not looked for: the guess leads
    tokens = [*prompt, 2, 3]  # a match of two tokens in the sequence wins
    lookup = PromptLookup(
        NgramProposer(1, 4), prompt_length=len(prompt), phrases=PhraseIndex(np.array([2, 3, 6, SEP]), min_n=2)
    )
    assert lookup.evidence(tokens) == 2 and lookup.draft(tokens, 2) == [8, 9]
