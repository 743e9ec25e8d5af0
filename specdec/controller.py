"""How many tokens to draft: per request from its acceptance, across requests from the load.

A round verifies k draft tokens with acceptance rate a and yields E(k) = (1 - a^(k+1)) / (1 - a)
tokens (Leviathan et al. 2023). Its cost is the target forward over all rows in flight, plus the
draft model's steps when there is one. Adding the j-th draft token of a request adds a^j expected
tokens and one row's worth of time dT to a round of every request; a round of the requests in
flight yields R = sum E / T tokens per second, so that token pays iff a^j > R * dT. Each request
drafts the largest k whose last token still passes that bar: long drafts when the server is idle
(a forward over a few extra rows costs little more than one row), shorter ones as rows pile up,
none when they no longer pay. R comes from the same cost model as dT, not from the server's
measured throughput: that one also counts prefills and idle clients, which would lower the bar.

Costs come from the engines' forward times by row count: calibrated at start-up and kept current
by the engines from the forwards they run (the calibration files in the build folder); acceptance
is a per-request estimate that starts from the proposer's recent average.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdec.config import AdaptiveOptions


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round yields: accepted drafts plus the target's own token."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass
class ForwardCost:
    """Seconds of one engine forward as a function of the rows it computes: the shape of a table
    calibrated at start-up (interpolated, extrapolated linearly beyond it), times one scale that
    follows the forwards observed since. One scale rather than an entry per row count: in service
    a forward of few rows often runs beside the server's other work (a lone call's one-row forward
    took 35 ms against 13 calibrated), and entries moved one by one, kept non-decreasing, had
    flattened the table (1 to 16 rows all 35-37 ms), which priced extra draft rows at nothing."""

    rows: list[int]
    seconds: list[float]  # as calibrated
    scale: float = 1.0  # observed / calibrated

    @classmethod
    def load(cls, path: Path) -> ForwardCost | None:
        if not path.is_file():
            return None
        table = json.loads(path.read_text())
        rows, seconds = [int(r) for r in table["rows"]], [float(s) for s in table["seconds"]]
        return cls(rows, seconds, float(table.get("scale", 1.0)))

    def to_json(self) -> str:
        return json.dumps({"rows": self.rows, "seconds": self.seconds, "scale": self.scale})

    def time(self, rows: float) -> float:
        return self.scale * self._calibrated(rows)

    def _calibrated(self, rows: float) -> float:
        rows = max(rows, 1.0)
        if rows > self.rows[-1]:  # extrapolate with the last segment's slope
            slope = (self.seconds[-1] - self.seconds[-2]) / (self.rows[-1] - self.rows[-2])
            return self.seconds[-1] + slope * (rows - self.rows[-1])
        return float(np.interp(rows, self.rows, self.seconds))

    def marginal(self, rows: float) -> float:
        """Seconds one more row adds."""
        return max(self.time(rows + 1) - self.time(rows), 0.0)

    def observe(self, rows: int, seconds: float, weight: float = 0.05) -> None:
        """Move the scale toward this forward's time over its calibrated time."""
        if seconds <= 0 or rows < 1:
            return
        ratio = seconds / self._calibrated(rows)
        # one stalled forward (the OS, another process) must not swing the scale: clip its pull
        ratio = min(max(ratio, 0.5 * self.scale), 2.0 * self.scale)
        self.scale += weight * (ratio - self.scale)


@dataclass
class Acceptance:
    """Acceptance of one request's drafts: geometric-model counts with forgetting, starting from
    a prior worth a couple of tokens."""

    accepted: float
    trials: float

    @property
    def rate(self) -> float:
        """The estimate, kept below 1: at a certain acceptance every draft length would pay."""
        return min(self.accepted / self.trials, 0.99) if self.trials else 0.0

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
        rate = state.acceptance.rate
        bar = self._bar(state)
        # the largest k whose last draft token still pays: rate^k > bar (with hysteresis)
        k = 0 if rate <= 0 or bar >= 1 else min(limit, int(math.log(max(bar, 1e-9)) / math.log(max(rate, 1e-9))))
        if abs(k - state.k) == 1 and self._within_hysteresis(rate, bar, min(k, state.k) + 1):
            k = min(state.k, limit)
        k = max(k, min(self.options.min_draft_tokens, limit))
        if k == 0:
            # Without drafts there is no news of this request's acceptance: probe now and then,
            # when the proposer's recent average elsewhere says a draft token would pay (under
            # load it would not, and a probe is then a row of pure cost).
            state.rounds_without_drafts += 1
            proposer_rate = self.prior.get(state.proposer, self.options.prior_acceptance)
            if state.rounds_without_drafts >= self.options.probe_every and proposer_rate > bar:
                state.rounds_without_drafts = 0
                k = 1
        state.k = k
        return k

    def _bar(self, state: RequestState) -> float:
        """Expected tokens a draft token must bring to pay for its time: the round's tokens per
        second (R) x the time the token adds (dT)."""
        rows = self.rows_in_flight()
        drafting = [s for s in self.requests.values() if s.proposer == "draft_model"]
        round_time = self.target.time(rows)
        cost = self.target.marginal(rows)
        if drafting and self.draft is not None:
            step = self.draft.time(len(drafting))  # one draft step for the whole draft batch
            round_time += max(s.k for s in drafting) * step
            if state.proposer == "draft_model":
                cost += step / len(drafting)
        tokens = sum(expected_tokens(s.acceptance.rate, s.k) for s in self.requests.values())
        return tokens / round_time * cost

    def _within_hysteresis(self, rate: float, bar: float, j: int) -> bool:
        """Is the j-th draft token's worth too close to the bar to justify changing k?"""
        margin = self.options.hysteresis
        return bar * (1 - margin) < rate**j < bar * (1 + margin)

    # --- observations -----------------------------------------------------------------------------
    def observe(self, key: str, drafted: int, accepted: int) -> None:
        state = self.requests.get(key)
        if state is None or not drafted:
            return
        state.acceptance.observe(drafted, accepted, 1.0 - self.options.ema_alpha)
        prior = self.prior.get(state.proposer, self.options.prior_acceptance)
        self.prior[state.proposer] = prior + self.options.ema_alpha * (accepted / drafted - prior)

    def mean_k(self, proposer: str) -> float:
        ks = [s.k for s in self.requests.values() if s.proposer == proposer]
        return sum(ks) / len(ks) if ks else 0.0


def calibration_path(build_dir: Path, model: str) -> Path:
    return build_dir / "calibration" / f"{model}.json"
