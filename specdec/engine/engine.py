"""The PyTorch engine: batched generation and draft verification over the slot KV cache.

It implements what the TensorRT-LLM backend does for one call: given a sequence's full input
ids, optional draft tokens (and draft logits) and a number of new tokens, it returns the accepted
draft tokens plus one token of its own (a verification: one forward pass), or the new tokens
(plain generation: one forward pass per token).
All requests of a call share each forward pass: their uncached context, drafts and decode rows
are concatenated into one set of rows.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from specdec.config import GUESS_MARGIN
from specdec.engine import sampling, verify
from specdec.engine.guess import GuessHead
from specdec.engine.kv_slots import CacheFullError, SlotTable
from specdec.engine.model import Llama, resolve_dtype
from specdec.engine.sampling import SamplingError, SamplingParams

# Every row count a verification at low load can have, then sparser: on the CPU a forward's time
# is a staircase (matmul blocks of rows), which interpolating between powers of two would hide.
CALIBRATION_ROWS = (*range(1, 18), 24, 32, 48, 64)
CALIBRATION_CONTEXT = 256  # tokens before the calibrated rows: a grounded prompt's and its answer's


class RequestError(ValueError):
    """A request the engine cannot run; the message names the field."""


@dataclass
class GenerationRequest:
    input_ids: np.ndarray  # (L,) int: the whole sequence so far
    max_new_tokens: int = 1
    draft_ids: np.ndarray | None = None  # (k,) proposed continuation to verify
    draft_logits: np.ndarray | None = None  # (k, V) the proposer's logits; None = deterministic proposer
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    min_tokens: int = 0  # the call's first min_tokens new tokens are not end_id (its logit is -inf there)
    sequence_key: str = ""  # "" = keep nothing after the call
    cache_salt: str = ""  # reuse only prefixes that requests of this salt left (kv_slots.py)
    return_logits: bool = False
    return_guess: bool = False  # guess the token after the last new one (needs the engine's guess head)


@dataclass
class GenerationResult:
    tokens: np.ndarray  # (n,) int32 new tokens: accepted drafts, then the engine's own
    logits: np.ndarray | None = None  # (n, V) float32 raw logits each new token was drawn from
    num_draft: int = 0
    num_accepted: int = 0
    reused: int = 0  # input tokens whose cache was reused
    # the guess head's token after the last new one, then the others it finds plausible; []: none
    next_guesses: list[int] = field(default_factory=list)


@dataclass
class _Seq:
    index: int
    req: GenerationRequest
    slot: int
    key: str
    reused: int
    tokens: list[int]  # the full sequence, growing as tokens are emitted
    cached: int  # tokens[:cached] are in the slot's cache
    new: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    num_accepted: int = 0
    done: bool = False
    guesses: list[int] = field(default_factory=list)


Scores = torch.Tensor | list[int]  # a forward's logits (R, V), or where only they are wanted each row's argmax


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum (a NaN counting as one), as torch's argmax; on CPU through
    numpy, whose argmax is many times faster than torch's on the one thread the engine leaves it."""
    if logits.device.type == "cpu":
        return torch.from_numpy(logits.numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def _set_threads(threads: int | None) -> None:
    """numba runs the heavy kernels on `threads` cores (default: all). On CPU torch only does
    small glue ops: one thread keeps its OpenMP pool from competing with numba's."""
    import numba

    cores = threads or os.cpu_count() or 1
    torch.set_num_threads(1)
    numba.set_num_threads(min(cores, numba.config.NUMBA_NUM_THREADS))


class ForwardLock:
    """One forward pass at a time across the engine processes of a server (target and draft).
    On a CPU they share the cores: two forwards at once make each wait for its threads that the
    other one preempts, and both run far slower than one after the other."""

    def __init__(self, path: str | Path | None):
        self._file = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a")  # noqa: SIM115 - held for the engine's lifetime

    def __enter__(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)


class Engine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        kv_slots: int = 16,
        max_seq_len: int = 2048,
        threads: int | None = None,
        lock_file: str | Path | None = None,
        guess_head: str | Path | None = None,
        guess_margin: float = GUESS_MARGIN,
        kv_cache_reuse: bool = True,
    ):
        """kv_cache_reuse: a new sequence reuses the keys/values of a prefix that an ended one
        left in its slot (kv_slots.py)."""
        dtype = resolve_dtype(dtype, device)
        _set_threads(threads)
        self.forward_lock = ForwardLock(lock_file)
        self.model = Llama(Path(model_dir), device=device, dtype=dtype)
        self.max_seq_len = min(max_seq_len, self.model.cfg.max_position_embeddings)
        self.cache = self.model.new_cache(kv_slots, self.max_seq_len)
        self.slots = SlotTable(kv_slots, share_prefixes=kv_cache_reuse)
        self.vocab_size = self.model.cfg.vocab_size
        self.device = self.model.device
        self.guess_head = (
            GuessHead(guess_head, self.model, kv_slots, self.max_seq_len, guess_margin) if guess_head else None
        )
        self.max_batch_seen = 0  # largest number of requests served by one generate() call
        # (rows, seconds, alone: the only sequence served, sequences) of the latest forwards, for
        # whoever keeps the cost model current (ForwardCost.observe)
        self.recent_forwards: deque[tuple[int, float, bool, int]] = deque(maxlen=1024)

    def warmup(self) -> None:
        """Run tiny generations so kernels are compiled (or loaded from numba's cache) before
        the first real request, not during it: greedy, and sampled with a deterministic and a
        stochastic draft (sampling's kernels); then greedy alone (the argmax without logits)."""
        prompt, draft = np.array([0, 1], dtype=np.int64), np.array([1])
        sampled = SamplingParams(temperature=1.0, top_k=8, top_p=0.9)
        greedy = GenerationRequest(prompt, 2, draft, return_guess=self.guess_head is not None)
        self.generate(
            [
                greedy,
                GenerationRequest(prompt, 2, draft, sampling=sampled),
                GenerationRequest(prompt, 2, draft, np.zeros((1, self.vocab_size), np.float32), sampled),
            ]
        )
        self.generate([greedy])
        self.recent_forwards.clear()  # compilation time is no forward's cost

    def calibration_key(self, rows: tuple[int, ...], repeats: int) -> str:
        """What a calibration's times depend on, as a hash: the model's shapes (its config, the
        layers loaded), how it computes (dtype, device, threads, the engine's sources, torch and
        numba), the cache it attends over, the calibration's own arguments, and the machine (CPU
        model and the cores this process may use). Weights' values change no forward's time."""
        import platform

        import numba

        cpu = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                   platform.processor()) if Path("/proc/cpuinfo").is_file() else platform.processor()  # fmt: skip
        sources = hashlib.sha256()
        for source in sorted(Path(__file__).parent.glob("*.py")):
            sources.update(source.read_bytes())
        key = {
            "model": asdict(self.model.cfg), "dtype": str(self.model.dtype), "device": str(self.device),
            "ops": type(self.model.ops).__name__, "kv_slots": len(self.slots.slots), "max_seq_len": self.max_seq_len,
            "guess_head": self.guess_head is not None, "rows": list(rows), "repeats": repeats,
            "context": CALIBRATION_CONTEXT, "sources": sources.hexdigest(), "torch": torch.__version__,
            "numba": [numba.__version__, numba.get_num_threads()], "cpu": [cpu, sorted(os.sched_getaffinity(0))],
            "gpu": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
        }  # fmt: skip
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]

    def calibrated(self, cache_dir: Path | None, rows: tuple[int, ...] = CALIBRATION_ROWS,
                   repeats: int = 5) -> dict[str, list]:  # fmt: skip
        """calibrate()'s table, from `cache_dir` where an earlier calibration of the same key
        (calibration_key) left it there, else measured and left there for the next start: a
        restart of the server then skips the longest step of loading an engine. A cache that
        cannot be read or written is passed by."""
        path = cache_dir / f"{self.calibration_key(rows, repeats)}.json" if cache_dir is not None else None
        try:
            if path is not None and path.is_file():
                return json.loads(path.read_text())
        except (OSError, ValueError):
            pass
        table = self.calibrate(rows, repeats)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                staged = path.with_suffix(f".{os.getpid()}.tmp")  # engines of several servers may write it at once
                staged.write_text(json.dumps(table))
                os.replace(staged, path)
            except OSError:
                pass
        return table

    def calibrate(self, rows: tuple[int, ...] = CALIBRATION_ROWS, repeats: int = 5) -> dict[str, list]:
        """Seconds of one forward by number of rows: the cost model the spec_decode controller
        starts from. The rows follow a context of CALIBRATION_CONTEXT tokens, as a verification's
        do: attention's share of a row's cost grows with the context, so rows at position 0
        would price a verification's extra rows low. The best of `repeats` passes over all the
        counts, each pass under the lock shared with the server's other engine: a slow spell (at a
        server's start, the other engine loading) then falls on every count of a pass, not on a
        few counts only, which would bend the shape the controller plans by. Uses a free slot and
        leaves it free."""
        context = max(0, min(CALIBRATION_CONTEXT, self.max_seq_len - max(rows) - 1))
        rows = tuple(r for r in rows if context + r < self.max_seq_len)
        slot, _, key, _ = self.slots.acquire("", np.zeros(1, dtype=np.int64), set())
        seconds = [math.inf] * len(rows)

        def forward_args(positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # tokens, positions, slots and logit rows (all)
            n = len(positions)
            return (
                positions % self.vocab_size,
                positions,
                torch.full((n,), slot, device=self.device),
                torch.arange(n, device=self.device),
            )

        try:
            inputs = [forward_args(torch.arange(context, context + n, device=self.device)) for n in rows]
            with self.forward_lock:
                self._timed_forward(*forward_args(torch.arange(context, device=self.device)))
            for _ in range(repeats):
                with self.forward_lock:
                    # untimed: the first forward after the lock changes hands runs slow, and the
                    # table is made non-decreasing (ForwardCost), so a slow first count would price
                    # every larger count as slow as it
                    self._timed_forward(*inputs[0])
                    for i, args in enumerate(inputs):  # (greedy: as most served rounds run)
                        seconds[i] = min(seconds[i], self._timed_forward(*args, greedy=True)[2])
        finally:
            self.slots.release(key)
        return {"rows": list(rows), "seconds": seconds}

    # ------------------------------------------------------------------ public API
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult | Exception]:
        results: list[GenerationResult | Exception] = [RuntimeError("not run")] * len(requests)
        self.max_batch_seen = max(self.max_batch_seen, len(requests))
        seqs: list[_Seq] = []
        busy: set[int] = set()
        for i, req in enumerate(requests):
            try:
                self._validate(req)
                slot, reused, key, copy_from = self.slots.acquire(
                    req.sequence_key, np.asarray(req.input_ids), busy, req.cache_salt
                )
            except (RequestError, CacheFullError) as err:
                results[i] = err
                continue
            if copy_from is not None:
                self.cache.copy_prefix(copy_from, slot, reused)
            busy.add(slot)
            ids = np.asarray(req.input_ids).tolist()
            seqs.append(_Seq(i, req, slot, key, reused, ids, cached=reused))

        first = True
        while pending := [s for s in seqs if not s.done]:
            self._step(pending, with_drafts=first)
            if first:
                # A verification is one forward pass: its accepted drafts and one token of the
                # target's own, even when request_output_len (k + 1) would allow more.
                for s in pending:
                    s.done = s.done or (s.req.draft_ids is not None and len(s.req.draft_ids) > 0)
            first = False

        for s in seqs:
            self.slots.record(s.slot, np.asarray(s.tokens[: s.cached], dtype=np.int64))
            if not s.req.sequence_key:
                self.slots.release(s.key)
            logits = torch.stack(s.logits).cpu().numpy() if s.req.return_logits else None
            results[s.index] = GenerationResult(
                tokens=np.asarray(s.new, dtype=np.int32),
                logits=logits,
                num_draft=0 if s.req.draft_ids is None else len(s.req.draft_ids),
                num_accepted=s.num_accepted,
                reused=s.reused,
                next_guesses=s.guesses,
            )
        return results

    def release(self, sequence_key: str) -> bool:
        """Free the slot of a finished or abandoned sequence."""
        return self.slots.release(sequence_key)

    # ------------------------------------------------------------------ internals
    def _validate(self, req: GenerationRequest) -> None:
        ids = np.asarray(req.input_ids)
        if ids.ndim != 1 or len(ids) == 0:
            raise RequestError("input_ids: must be a non-empty 1-D list of token ids")
        drafts = np.asarray(req.draft_ids if req.draft_ids is not None else [], dtype=np.int64)
        for name, arr in (("input_ids", ids), ("draft_input_ids", drafts)):
            if len(arr) and (arr.min() < 0 or arr.max() >= self.vocab_size):
                raise RequestError(f"{name}: token ids must be in [0, {self.vocab_size})")
        if req.return_guess and self.guess_head is None:
            raise RequestError("return_next_guess: this engine has no guess head")
        if req.max_new_tokens < 1:
            raise RequestError(f"request_output_len: must be >= 1, got {req.max_new_tokens}")
        needed = len(ids) + max(len(drafts) + 1, req.max_new_tokens)
        if needed > self.max_seq_len:
            raise RequestError(
                f"input_ids: {len(ids)} tokens plus {needed - len(ids)} new exceed the engine's "
                f"max_seq_len of {self.max_seq_len}"
            )
        if req.draft_logits is not None:
            shape = np.shape(req.draft_logits)
            if shape != (len(drafts), self.vocab_size):
                raise RequestError(f"draft_logits: shape must be ({len(drafts)}, {self.vocab_size}), got {shape}")
            if req.sampling.greedy:
                raise RequestError("draft_logits: only meaningful when sampling (temperature > 0)")
        try:
            req.sampling.validate()
        except SamplingError as err:
            raise RequestError(str(err)) from None

    def _forward(self, *args: torch.Tensor, greedy: bool = False) -> tuple[torch.Tensor, Scores, float]:
        """The model's forward under the lock shared with the server's other engine: its final
        hidden states, logits (greedy: each row's argmax) and seconds (not counting the wait for
        the lock)."""
        with self.forward_lock:
            return self._timed_forward(*args, greedy=greedy)

    def _timed_forward(self, *args: torch.Tensor, greedy: bool = False) -> tuple[torch.Tensor, Scores, float]:
        """greedy: no row's logits are wanted but for their argmax, which the model then takes
        without writing them out (Llama.greedy_tokens: a verification's logits, written out, are
        megabytes an argmax would read back from memory)."""
        start = time.perf_counter()
        hidden = self.model.hidden(self.cache, *args)
        out = self.model.greedy_tokens(hidden) if greedy else self.model.logits(hidden)
        return hidden, out, time.perf_counter() - start

    def _step(self, seqs: list[_Seq], with_drafts: bool) -> None:
        """One forward over every pending sequence, then accept / sample its new tokens."""
        tokens: list[int] = []
        positions: list[int] = []
        slot_of_row: list[int] = []
        logit_rows: list[int] = []
        drafts: list[list[int]] = []
        for s in seqs:
            d = [int(t) for t in s.req.draft_ids] if with_drafts and s.req.draft_ids is not None else []
            fresh = s.tokens[s.cached :] + d  # uncached context (at least the last token) + drafts
            start = len(tokens)
            tokens += fresh
            positions += range(s.cached, s.cached + len(fresh))
            slot_of_row += [s.slot] * len(fresh)
            # logits of the last context token and of each draft token
            logit_rows += range(start + len(fresh) - len(d) - 1, start + len(fresh))
            drafts.append(d)

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        greedy = [i for i, s in enumerate(seqs) if s.req.sampling.greedy]
        held = [i for i, s in enumerate(seqs) if s.req.end_id is not None and len(s.new) < s.req.min_tokens]
        only_greedy = len(greedy) == len(seqs) and not held and not any(s.req.return_logits for s in seqs)
        hidden, out, seconds = self._forward(
            tensor(tokens), tensor(positions), tensor(slot_of_row), tensor(logit_rows), greedy=only_greedy
        )
        self.recent_forwards.append((len(tokens), seconds, self.slots.in_use == 1, len(seqs)))
        starts = np.cumsum([0] + [len(d) + 1 for d in drafts])[:-1]  # each sequence's first logit row
        logits: torch.Tensor | None = None  # (rows, V), where a row is sampled or its logits kept
        if only_greedy:
            best = out  # each row's argmax
        else:
            logits = out
            with torch.inference_mode():  # (the forward's logits are inference tensors)
                for i in held:  # no end token before min_tokens: as if the model could not write it there
                    s = seqs[i]
                    rows = min(len(drafts[i]) + 1, s.req.min_tokens - len(s.new))
                    logits[starts[i] : starts[i] + rows, s.req.end_id] = -math.inf
            best = _argmax(logits).tolist() if greedy else []
        verified = [verify.greedy_verify(best[starts[i] : starts[i] + len(drafts[i]) + 1], drafts[i]) for i in greedy]
        verdicts = dict(zip(greedy, verified, strict=True))
        # sampled sequences whose drafts (if any) are deterministic: coupled to plain sampling
        coupled = [
            i for i, s in enumerate(seqs) if not s.req.sampling.greedy and (s.req.draft_logits is None or not drafts[i])
        ]
        if coupled:
            assert logits is not None
            verdicts.update(zip(coupled, self._verify_coupled(
                [seqs[i] for i in coupled], logits, starts[coupled], [drafts[i] for i in coupled]
            ), strict=True))  # fmt: skip
        wanting: list[tuple[_Seq, int]] = []  # sequences that want a guess, the row of their last token
        for i, (s, d) in enumerate(zip(seqs, drafts, strict=True)):
            rows = None if logits is None else logits[starts[i] : starts[i] + len(d) + 1]
            emitted, accepted = verdicts[i] if i in verdicts else self._rejection_sample(s, rows, d)
            s.num_accepted += accepted
            s.cached = len(s.tokens) + accepted  # rejected drafts' cache is stale
            kept = self._emit(s, emitted, rows)
            if s.req.return_guess and s.tokens[-1] != s.req.end_id:
                wanting.append((s, starts[i] + kept - 1))
        if wanting:
            assert self.guess_head is not None  # (_validate)
            last = tensor([s.tokens[-1] for s, _ in wanting])
            rows = [row for _, row in wanting]
            slots = [s.slot for s, _ in wanting]
            guesses = self.guess_head.guesses(hidden[rows], last, slots, [s.tokens for s, _ in wanting])
            for (s, _), g in zip(wanting, guesses, strict=True):
                s.guesses = g

    def _verify_coupled(
        self, seqs: list[_Seq], logits: torch.Tensor, starts: np.ndarray, drafts: list[list[int]]
    ) -> list[tuple[list[int], int]]:
        """(emitted tokens, accepted drafts) of each sampled sequence with a deterministic draft
        (starts: their first logit rows): verify.sampled_verify, each position's rows drawn in one
        draw() per set of sampling parameters, so a step of many sequences with drafts draws in
        about one call a draft position, not one for each row after an accepted draft: drawn row
        by row, sampling is a large share of the engine's time at high concurrency with top_p."""

        def draw(pairs: list[tuple[int, int]]) -> list[int]:
            groups: dict[SamplingParams, list[int]] = {}  # sampling without its seed -> indices into pairs
            for n, (b, _) in enumerate(pairs):
                groups.setdefault(replace(seqs[b].req.sampling, seed=0), []).append(n)
            tokens = [0] * len(pairs)
            for params, members in groups.items():
                at = [pairs[n] for n in members]
                uniforms = torch.cat(
                    [
                        sampling.sample_uniforms(seqs[b].req.sampling.seed, [len(seqs[b].tokens) + i], self.device)
                        for b, i in at
                    ]
                )
                rows = [int(starts[b]) + i for b, i in at]
                for n, token in zip(members, sampling.draw(logits, params, uniforms, rows).tolist(), strict=True):
                    tokens[n] = token
            return tokens

        return verify.sampled_verify(drafts, draw)

    def _rejection_sample(self, s: _Seq, rows: torch.Tensor, d: list[int]) -> tuple[list[int], int]:
        """(emitted tokens, accepted drafts) of a sampled sequence with a stochastic draft
        (draft_logits): the rejection sampler over its rows."""
        params = s.req.sampling
        positions = list(range(len(s.tokens), len(s.tokens) + len(d) + 1))
        verdict = verify.rejection_sample(
            sampling.probs(rows, params)[None],
            torch.tensor([d], dtype=torch.int64, device=self.device),
            torch.tensor([len(d)], device=self.device),
            sampling.probs(torch.as_tensor(s.req.draft_logits, device=self.device), params)[None],
            sampling.uniform_noise(params.seed, positions[:-1], self.device)[None],
            sampling.sample_uniforms(params.seed, positions, self.device)[None],
        )
        return verdict.emitted(0), int(verdict.num_accepted[0])

    def _emit(self, s: _Seq, emitted: list[int], rows: torch.Tensor | None) -> int:
        """Append tokens until the end id or the requested count; later ones are dropped. How
        many it kept. rows: the logits they were chosen from (None: not kept, no row asks)."""
        kept = 0
        for tok in emitted:
            s.tokens.append(tok)
            s.new.append(tok)
            if s.req.return_logits:
                s.logits.append(rows[kept])
            kept += 1
            if tok == s.req.end_id or len(s.new) >= s.req.max_new_tokens:
                s.done = True
                break
        s.cached = min(s.cached, len(s.tokens))
        return kept
