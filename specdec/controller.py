"""How many tokens to draft: per request from its acceptance, across requests from the load.

A round verifies k draft tokens with acceptance rate a and yields E(k) = (1 - a^(k+1)) / (1 - a)
tokens (Leviathan et al. 2023). Its cost is the target forward over all rows in flight, plus the
draft model's steps when there is one. Adding the j-th draft token of a request adds a^j expected
tokens and one row's worth of time dT to a round of every request; at throughput R (tokens/s of
the server) that pays iff a^j > R * dT. So each request drafts the largest k whose last token
still passes that bar: long drafts when the server is idle (a forward over a few extra rows costs
little more than one row), shorter ones as rows pile up, none when they no longer pay.

Costs come from the engines' start-up calibration (forward time by row count, written to the
build folder by each engine model) scaled by how the observed round times compare (kept current);
acceptance is a per-request estimate that starts from the proposer's recent average.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdec.config import AdaptiveOptions

THROUGHPUT_WEIGHT = 0.2  # of the newest round in the server's throughput estimate


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round yields: accepted drafts plus the target's own token."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass
class ForwardCost:
    """Seconds of one engine forward as a function of the rows it computes, interpolated from a
    calibration table and scaled by an online correction factor."""

    rows: list[int]
    seconds: list[float]
    scale: float = 1.0

    @classmethod
    def load(cls, path: Path) -> ForwardCost | None:
        if not path.is_file():
            return None
        table = json.loads(path.read_text())
        return cls([int(r) for r in table["rows"]], [float(s) for s in table["seconds"]])

    def time(self, rows: float) -> float:
        rows = max(rows, 1.0)
        if rows > self.rows[-1]:  # extrapolate with the last segment's slope
            slope = (self.seconds[-1] - self.seconds[-2]) / (self.rows[-1] - self.rows[-2])
            return self.scale * (self.seconds[-1] + slope * (rows - self.rows[-1]))
        return self.scale * float(np.interp(rows, self.rows, self.seconds))

    def marginal(self, rows: float) -> float:
        """Seconds one more row adds."""
        return self.time(rows + 1) - self.time(rows)

    def observe(self, rows: float, seconds: float, weight: float = 0.1) -> None:
        predicted = self.time(rows) / self.scale
        if predicted > 0 and seconds > 0:
            self.scale += weight * (min(seconds / predicted, 10.0) - self.scale)


@dataclass
class Acceptance:
    """Acceptance of one request's drafts: geometric-model counts with forgetting, starting from
    a prior worth a couple of tokens."""

    accepted: float
    trials: float

    @property
    def rate(self) -> float:
        return self.accepted / self.trials if self.trials else 0.0

    def observe(self, drafted: int, accepted: int, decay: float) -> None:
        # drafts are tried in order until the first rejection: n successes, plus 1 failure if n < k
        self.accepted = decay * self.accepted + accepted
        self.trials = decay * self.trials + accepted + (accepted < drafted)


@dataclass
class RequestState:
    proposer: str
    limit: int  # the request's num_draft_tokens: the most it may draft
    acceptance: Acceptance
    k: int = 0
    rounds_without_drafts: int = 0


@dataclass
class Controller:
    options: AdaptiveOptions
    target: ForwardCost | None = None
    draft: ForwardCost | None = None
    prior: dict[str, float] = field(default_factory=dict)  # proposer -> recent acceptance
    requests: dict[str, RequestState] = field(default_factory=dict)
    throughput: float = 0.0  # tokens/s of the whole server, an EMA over rounds

    # --- request life cycle -----------------------------------------------------------------------
    def start(self, key: str, proposer: str, limit: int) -> None:
        prior = self.prior.get(proposer, self.options.prior_acceptance)
        weight = self.options.prior_weight
        self.requests[key] = RequestState(proposer, limit, Acceptance(prior * weight, weight), k=limit)

    def finish(self, key: str) -> None:
        self.requests.pop(key, None)

    # --- decisions --------------------------------------------------------------------------------
    def rows_in_flight(self) -> int:
        return sum(s.k + 1 for s in self.requests.values())

    def choose_k(self, key: str, budget: int) -> int:
        """The draft length for the request's next round, at most `budget`."""
        state = self.requests[key]
        limit = min(state.limit, budget)
        if not self.options.enabled or limit <= 0 or self.target is None:
            state.k = limit
            return limit
        rate = min(state.acceptance.rate, 0.99)
        bar = self._bar(state)
        # the largest k whose last draft token still pays: rate^k > bar (with hysteresis)
        k = 0 if rate <= 0 or bar >= 1 else min(limit, int(math.log(max(bar, 1e-9)) / math.log(max(rate, 1e-9))))
        if abs(k - state.k) == 1 and self._within_hysteresis(rate, bar, min(k, state.k) + 1):
            k = min(state.k, limit)
        k = max(k, min(self.options.min_draft_tokens, limit))
        if k == 0:
            # Without drafts there is no news of the acceptance: probe now and then.
            state.rounds_without_drafts += 1
            if state.rounds_without_drafts >= self.options.probe_every:
                state.rounds_without_drafts = 0
                k = 1
        state.k = k
        return k

    def _bar(self, state: RequestState) -> float:
        """Expected tokens a draft token must bring to pay for its time: throughput x marginal cost."""
        rows = self.rows_in_flight()
        cost = self.target.marginal(rows)
        if state.proposer == "draft_model" and self.draft is not None:
            batch = sum(1 for s in self.requests.values() if s.proposer == "draft_model")
            cost += self.draft.time(batch) / max(batch, 1)  # one more draft step, shared by the batch
        throughput = self.throughput or len(self.requests) / self.target.time(rows)
        return throughput * cost

    def _within_hysteresis(self, rate: float, bar: float, j: int) -> bool:
        """Is the j-th draft token's worth too close to the bar to justify changing k?"""
        margin = self.options.hysteresis
        return bar * (1 - margin) < rate**j < bar * (1 + margin)

    # --- observations -----------------------------------------------------------------------------
    def observe(self, key: str, drafted: int, accepted: int, emitted: int, seconds: float, rows: int) -> None:
        state = self.requests.get(key)
        if state is None:
            return
        decay = 1.0 - self.options.ema_alpha
        if drafted:
            state.acceptance.observe(drafted, accepted, decay)
            prior = self.prior.get(state.proposer, self.options.prior_acceptance)
            self.prior[state.proposer] = prior + self.options.ema_alpha * (accepted / drafted - prior)
        if seconds > 0:
            if self.target is not None:
                self.target.observe(rows, seconds)
            # each request contributes its own rate; the server's is their sum over the batch
            rate = emitted / seconds * max(len(self.requests), 1)
            self.throughput += THROUGHPUT_WEIGHT * (rate - self.throughput)

    def mean_k(self, proposer: str) -> float:
        ks = [s.k for s in self.requests.values() if s.proposer == proposer]
        return sum(ks) / len(ks) if ks else 0.0


def calibration_path(build_dir: Path, model: str) -> Path:
    return build_dir / "calibration" / f"{model}.json"
