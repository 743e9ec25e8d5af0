"""How many tokens to draft: per request from its acceptance, across requests from the load.

A round verifies k draft tokens and yields E(k) tokens: the accepted drafts plus the target's own.
With one acceptance rate a for every draft token, E(k) = (1 - a^(k+1)) / (1 - a) (Leviathan et al.
2023). Prompt lookup's drafts are copies: they miss at once or start right and run on (the first
token is accepted far less often than each next one after an accepted one), so the estimate keeps
two rates, a1 for the first token and a for each next one, and E(k) = 1 + a1 (1 - a^k) / (1 - a),
which is Leviathan's where the two are equal.

A proposer that looks before it drafts tells how strong its evidence is: prompt lookup, the
length of the suffix it matched. First tokens are counted by that length, because it decides
them (after a 1-token match the first token is rarely accepted, after a 4-token match mostly),
so a round drafts long from a strong match and little or nothing from a weak one
(benchmarks/policy_replay.py prices this against one length for all and against a cap for each
match length).

A round's cost is the target forward over all rows in flight, plus the draft model's steps when
there is one, plus what a served round costs beyond its forwards whatever its rows (measured:
observe_round()). The controller plans the draft lengths of all requests in flight that maximise the
next round's expected tokens per second (plan()): long drafts when the server is idle (a forward
over a few extra rows costs little more than one row), shorter ones as rows pile up, none when
they no longer pay. The plan is over the cost model's exact shape: on the CPU a forward's time is
a staircase (the matmul takes rows in blocks: kernels._BLOCK on AVX-512, the AMX tiles' 16), which
a marginal cost per row would smooth away (benchmarks/policy_replay.py replays greedy outputs
priced with the engine's forward times, this controller against fixed draft lengths).

Costs come from the engines' forward times by row count: calibrated at start-up and kept current
by the engines from the forwards they run (the calibration files in the build folder).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import numpy as np

from specdec.config import AdaptiveOptions
from specdec.speculation.lookup import Lead

# What a proposer found before drafting (Controller.choose_k): prompt lookup's match length (0: nothing
# to draft) or what leads its draft; None from a proposer that finds out only by drafting.
Evidence = int | Lead | None


def token_value(first: float, then: float, j: int) -> float:
    """The expected tokens the j-th draft token (from 0) brings, when a request's first draft
    token is accepted with probability `first` and each next one, after an accepted one, with
    `then`: it counts iff it and all before it are accepted, first * then^j. A round of k draft
    tokens yields 1 + the sum over the first k, E(k) above. (Python floats: a round's decisions
    take a few dozen of them, and each numpy call is slow after a forward has emptied the caches,
    on cores the next forward waits for.)"""
    return first * then**j


SHAPE_WINDOW = 64  # a row count's latest lone forwards: its shape factor is their median
SHAPE_MIN = 16  # lone forwards of a row count before its own factor counts


@dataclass
class ForwardCost:
    """Seconds of one engine forward as a function of the rows it computes: the shape of a table
    calibrated at start-up (interpolated, extrapolated linearly beyond it), corrected row count
    by row count from the forwards of a lone sequence, times one scale that follows all the
    forwards observed since.

    One scale rather than an entry per row count: in service a forward of few rows often runs
    beside the server's other work, far over its calibrated time, and entries moved one
    by one, kept non-decreasing, would flatten the table up to such a time, which prices extra
    draft rows at nothing.

    The shape is learnt only from forwards while the engine serves one sequence (observe()'s
    `alone`), where no other request's work runs beside them: the start-up calibration is a best
    of a few passes at one moment of a shared machine (whose ratio of many rows to one can change
    from one minute to the next), and a served forward pays a cost every row count pays alike
    (the threads waking after the round trip), which the scale would multiply into the price of
    each extra row: a start-up table, scaled, overprices the extra rows of served forwards. Each
    count's factor is the median of its latest SHAPE_WINDOW lone forwards over the scaled
    calibrated time, once it has SHAPE_MIN; counts without one take their neighbours'
    (interpolated).

    It also follows how many sequences a forward carries (`sequences`, a moving average): under
    load the requests in flight do not all share one forward (Controller.plan())."""

    rows: list[int]
    seconds: list[float]  # as calibrated, made non-decreasing: a noisy dip must not attract drafts
    scale: float = 1.0  # observed / calibrated
    shape: dict[int, float] = field(default_factory=dict)  # row count -> its lone forwards / (scale x calibrated)
    sequences: float | None = None  # sequences a forward carries, lately (None: none observed)
    # seconds of 0, 1, 2, ... rows, looked up: interpolating is a few numpy calls, and a round asks
    # several times (the plan, the lockstep, observe_round()), the engine once a forward. As
    # calibrated; and before the scale (calibrated x shape, non-decreasing; None: to be made
    # again, the shape changed)
    _calibrated_by_rows: np.ndarray = field(init=False, repr=False)
    _by_rows: np.ndarray | None = field(default=None, init=False, repr=False)
    _by_rows_list: list[float] = field(default_factory=list, init=False, repr=False)  # _by_rows, Python floats
    _lone: dict[int, deque[float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.seconds = np.maximum.accumulate(self.seconds).tolist()
        self._calibrated_by_rows = self._interpolated(np.arange(2 * self.rows[-1] + 1))

    @classmethod
    def load(cls, path: Path) -> ForwardCost | None:
        if not path.is_file():
            return None
        table = json.loads(path.read_text())
        rows, seconds = [int(r) for r in table["rows"]], [float(s) for s in table["seconds"]]
        shape = {int(r): float(f) for r, f in table.get("shape", {}).items()}
        sequences = None if table.get("sequences") is None else float(table["sequences"])
        return cls(rows, seconds, float(table.get("scale", 1.0)), shape, sequences)

    def to_json(self) -> str:
        return json.dumps(
            {"rows": self.rows, "seconds": self.seconds, "scale": self.scale, "shape": self.shape,
             "sequences": self.sequences}
        )  # fmt: skip

    def time(self, rows: float) -> float:
        return float(self.times(np.asarray(rows)))

    def times(self, rows: np.ndarray) -> np.ndarray:
        """time() of each element of `rows`."""
        return self.scale * self._shaped(rows)

    def consecutive(self, first: int, count: int) -> list[float]:
        """time() of first, first + 1, ... rows (count of them), as Python floats: a plan asks for
        them every round, and numpy's calls are slow right after a forward."""
        table = self._table()[1]
        if first >= 0 and first + count <= len(table):
            return [self.scale * t for t in table[first : first + count]]
        return self.times(np.arange(first, first + count)).tolist()

    def _table(self) -> tuple[np.ndarray, list[float]]:
        """_by_rows, made again where the shape changed, and as Python floats."""
        if self._by_rows is None:
            whole = np.arange(len(self._calibrated_by_rows))
            self._by_rows = np.maximum.accumulate(self._calibrated_by_rows * self._factors(whole))
            self._by_rows_list = self._by_rows.tolist()
        return self._by_rows, self._by_rows_list

    def _shaped(self, rows: np.ndarray) -> np.ndarray:
        by_rows = self._table()[0]
        return self._looked_up(by_rows, rows, lambda r: self._interpolated(r) * self._factors(r))

    def _calibrated(self, rows: np.ndarray) -> np.ndarray:
        return self._looked_up(self._calibrated_by_rows, rows, self._interpolated)

    @staticmethod
    def _looked_up(table: np.ndarray, rows: np.ndarray, otherwise: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """table[rows] for whole row counts within it, else otherwise(rows)."""
        rows = np.asarray(rows)
        if rows.dtype.kind in "iu" and rows.size and rows.min() >= 0 and rows.max() < len(table):
            return table[rows]
        return otherwise(rows)

    def _factors(self, rows: np.ndarray) -> np.ndarray:
        if not self.shape:
            return np.ones(np.shape(rows))
        counts = sorted(self.shape)
        return np.interp(rows, counts, [self.shape[c] for c in counts])  # beyond them: the nearest

    def _interpolated(self, rows: np.ndarray) -> np.ndarray:
        rows = np.maximum(rows, 1.0)
        slope = (self.seconds[-1] - self.seconds[-2]) / (self.rows[-1] - self.rows[-2])
        beyond = self.seconds[-1] + slope * (rows - self.rows[-1])  # the last segment's slope
        return np.where(rows > self.rows[-1], beyond, np.interp(rows, self.rows, self.seconds))

    def observe(self, rows: int, seconds: float, alone: bool = False, sequences: int = 1, weight: float = 0.05) -> None:
        """Move the scale toward this forward's time over its calibrated time; `alone`: the
        engine served only this forward's sequence, so it also tells the shape; `sequences`: how
        many it carried."""
        if seconds <= 0 or rows < 1:
            return
        self.sequences = sequences if self.sequences is None else self.sequences + weight * (sequences - self.sequences)
        calibrated = float(self._calibrated(np.asarray(rows)))
        ratio = seconds / calibrated
        # one stalled forward (the OS, another process) must not swing the scale: clip its pull
        ratio = min(max(ratio, 0.5 * self.scale), 2.0 * self.scale)
        self.scale += weight * (ratio - self.scale)
        if alone and rows <= self.rows[-1]:
            lone = self._lone.setdefault(rows, deque(maxlen=SHAPE_WINDOW))
            lone.append(seconds / (self.scale * calibrated))
            if len(lone) >= SHAPE_MIN:
                self.shape[rows] = float(np.median(lone))
                self._by_rows = None


@dataclass
class Rate:
    """Successes and trials of one kind, counted with forgetting."""

    hits: float = 0.0
    trials: float = 0.0

    def estimate(self, prior: float, weight: float) -> float:
        """The rate, shrunk toward `prior` as if it had `weight` trials more; kept below 1 (at a
        certain acceptance every draft length would pay)."""
        return min((self.hits + weight * prior) / (self.trials + weight), 0.99)

    def upper(self, prior: float, weight: float) -> float:
        """The estimate plus two standard errors: what the rate may well be, for exploring."""
        rate = self.estimate(prior, weight)
        return min(rate + 2.0 * math.sqrt(rate * (1.0 - rate) / (self.trials + weight)), 0.99)

    def observe(self, hits: int, trials: int, decay: float) -> None:
        self.hits = decay * self.hits + hits
        self.trials = decay * self.trials + trials


@dataclass
class Acceptance:
    """How drafts fared: a draft is accepted up to its first rejection, so `accepted` of `drafted`
    tokens is one trial of its first token, then accepted - 1 successes and (if the draft went
    on) one failure of the tokens after an accepted one. Counts forget at every round; those by
    evidence at every round from that evidence (a strong match may come once in a while). By
    evidence the next tokens too: a copy after a long match runs on, a draft led by the engine's
    guess stops soon, and one next-token rate for both would draft the first short and the second
    long (benchmarks/policy_replay.py prices the policy against fixed draft lengths)."""

    first: Rate = field(default_factory=Rate)
    next: Rate = field(default_factory=Rate)
    first_by_evidence: dict[int | Lead, Rate] = field(default_factory=dict)  # first tokens by the proposer's evidence
    next_by_evidence: dict[int | Lead, Rate] = field(default_factory=dict)  # next tokens by the same

    def observe(self, drafted: int, accepted: int, evidence: Evidence, decay: float) -> None:
        hits = max(accepted - 1, 0)
        trials = hits + int(0 < accepted < drafted)
        self.first.observe(int(accepted > 0), 1, decay)
        self.next.observe(hits, trials, decay)
        if evidence:
            self.first_by_evidence.setdefault(evidence, Rate()).observe(int(accepted > 0), 1, decay)
            self.next_by_evidence.setdefault(evidence, Rate()).observe(hits, trials, decay)


@dataclass
class Plan:
    """Draft lengths for the next round of the requests in flight (Controller.plan())."""

    worth: float  # expected tokens of the least valuable draft token it drafts (inf: none)
    rate: float  # its expected tokens per second
    bar: float  # expected tokens one more draft row would have to bring to pay
    decisions_left: int  # decisions it serves before it is made again


@dataclass
class RequestState:
    proposer: str
    limit: int  # the request's num_draft_tokens: the most it may draft
    drafts: Acceptance  # its own
    pool: str  # whose recent drafts its rates start from: its proposer's, greedy or sampled
    k: int = 0
    evidence: Evidence = None  # what its proposer found for the round being decided or run
    rounds_without_drafts: int = 0


@dataclass
class Controller:
    """A request's first-token rate is its own count shrunk toward its proposer's recent rate over
    all requests (worth options.prior_weight tokens; greedy and sampled requests apart, start()):
    a new request starts from what the proposer does now. Its next-token rate is its own count
    shrunk toward its first-token rate, i.e. Leviathan's single rate, by
    options.next_prior_weight tokens: it leaves that only on evidence, which
    copies bring fast (several next tokens a round) and short drafts slowly (one-token drafts say
    nothing of the next tokens). Per request, because code and copy-edits copy long spans while
    answers and summaries copy short ones: one next-token rate for all would overdraft the latter.
    Where the proposer gives evidence, the first-token rate is the request's own count for that
    evidence, shrunk toward the proposer's recent rate for it over all requests, itself shrunk
    toward the proposer's overall rate; and the next-token rate the same way, toward the
    request's next-token rate."""

    options: AdaptiveOptions
    target: ForwardCost | None = None
    draft: ForwardCost | None = None
    recent: dict[str, Acceptance] = field(default_factory=dict)  # pool -> its drafts, all requests
    requests: dict[str, RequestState] = field(default_factory=dict)
    overhead_s: float = 0.0  # of a served round beyond its forwards: see observe_round()
    _plan: Plan | None = field(default=None, init=False, repr=False)  # made once a round: choose_k()

    # --- request life cycle -----------------------------------------------------------------------
    def start(self, key: str, proposer: str, limit: int, sampled: bool = False) -> None:
        """sampled: the request samples (temperature > 0). A draft token is then accepted only where
        the target samples it, less often than where it is the greedy token, so sampled requests'
        drafts are counted apart from greedy ones': counted together, sampled requests would start
        from the greedy ones' higher rate and overdraft."""
        pool = f"{proposer} sampled" if sampled else proposer
        self.requests[key] = RequestState(proposer, limit, Acceptance(), pool, k=limit)
        self._plan = None

    def finish(self, key: str) -> None:
        self.requests.pop(key, None)
        self._plan = None

    def rates(self, key: str) -> tuple[float, float]:
        """The request's (first-token, next-token) acceptance estimates, for a draft from its
        current evidence."""
        state = self.requests[key]
        return self._rates(state, state.evidence)

    def _rates(self, state: RequestState, evidence: Evidence) -> tuple[float, float]:
        weight = self.options.prior_weight
        first = state.drafts.first.estimate(self.pool_rate(state.pool), weight)
        then = state.drafts.next.estimate(first, self.options.next_prior_weight)
        if evidence and (recent := self.recent.get(state.pool)) is not None:
            prior = recent.first_by_evidence.get(evidence, Rate()).estimate(self.pool_rate(state.pool), weight)
            first = state.drafts.first_by_evidence.get(evidence, Rate()).estimate(prior, weight)
            prior = recent.next_by_evidence.get(evidence, Rate()).estimate(then, weight)
            then = state.drafts.next_by_evidence.get(evidence, Rate()).estimate(prior, weight)
        return first, then

    def would_draft(self, key: str, evidence: Evidence) -> bool:
        """Would the current plan draft for the request on this evidence? Asked before evidence
        that costs something is fetched: the engine's guess (specdec/engine/guess.py) is a
        fraction of a step, paid for nothing in a request that may not draft (num_draft_tokens
        0, as benchmarks/targets.py's A/A arm) or under a load at which a guess's draft would not
        pay."""
        state = self.requests.get(key)
        if state is None or state.limit <= 0:
            return False
        if not self.options.enabled or self.target is None or self._plan is None or state.pool not in self.recent:
            return True  # (no plan yet: it drafts what is asked)
        first, then = self._rates(state, evidence)
        return token_value(first, then, 0) >= self._plan.worth

    def pool_rate(self, pool: str) -> float:
        """The first-token rate of the recent drafts of a pool (RequestState.pool) over all requests."""
        recent = self.recent.get(pool)
        prior, weight = self.options.prior_acceptance, self.options.prior_weight
        return prior if recent is None else recent.first.estimate(prior, weight)

    # --- decisions --------------------------------------------------------------------------------
    def choose_k(self, key: str, budget: int, evidence: Evidence = None) -> int:
        """The draft length for the request's next round, at most `budget`: its part of the plan
        for the whole next round. `evidence`: what the proposer found before drafting (prompt
        lookup: the length of its match; 0: nothing to draft), None from one that finds out by
        drafting. The plan is made again once per round (after as many decisions as requests in
        flight) and whenever a request starts or ends: made for every decision, it would cost a
        share of each round at many requests in flight, on cores the forward needs. Each decision
        takes its request's draft tokens worth as much as the plan's least valuable one, valued
        with the evidence it has now (the plan had the evidence of its previous round)."""
        state = self.requests[key]
        state.evidence = evidence
        limit = 0 if evidence == 0 else min(state.limit, budget)
        if not self.options.enabled or limit <= 0 or self.target is None or state.pool not in self.recent:
            state.k = limit  # (a proposer without a history drafts what was asked: the estimates need it)
            return limit
        if self._plan is None or self._plan.decisions_left <= 0:
            self._plan = self.plan()
        plan = self._plan
        plan.decisions_left -= 1
        first, then = self.rates(key)
        values = [token_value(first, then, j) for j in range(limit)]
        k = sum(v >= plan.worth for v in values)  # values fall with the position in the draft
        # keep k while the token that would change it is worth about the bar: the estimates move
        # a little every round
        current = min(state.k, limit)
        if abs(k - current) == 1 and abs(values[min(k, current)] - plan.bar) <= self.options.hysteresis * plan.bar:
            k = current
        k = max(k, min(self.options.min_draft_tokens, limit))
        if k == 0:
            # Without drafts there is no news of acceptance: probe now and then, when the
            # proposer's recent first-token rate, give or take its error, says a draft token may
            # pay (under load it would not, and a probe is then a row of pure cost).
            state.rounds_without_drafts += 1
            recent = self.recent[state.pool].first.upper(self.options.prior_acceptance, self.options.prior_weight)
            if state.rounds_without_drafts >= self.options.probe_every and recent > self._probe_bar(state, plan):
                state.rounds_without_drafts = 0
                k = 1
        state.k = k
        return k

    def plan(self) -> Plan:
        """The draft lengths of every request in flight, each at most its limit, that maximise
        the next round's expected tokens per second.

        Exact under the model: the j-th draft token of request i brings v = a1_i a_i^(j-1)
        expected tokens, falling with j, so for any total of N draft rows the most tokens come
        from the N most valuable tokens, each request's a prefix of its draft; the round's time
        at each N is the cost model's (on the CPU a staircase), and the plan takes the best N."""
        states = list(self.requests.values())
        # every draft token as (its worth, its request, its position), the most valuable first
        # (a tie in request order)
        tokens = []
        for i, state in enumerate(states):
            first, then = self._rates(state, state.evidence)
            tokens += [(token_value(first, then, j), i, j) for j in range(state.limit)]
        tokens.sort(key=lambda token: -token[0])
        # the round's expected tokens and seconds with the first n of them, n = 0 .. len(tokens)
        gained = list(accumulate((token[0] for token in tokens), initial=float(len(states))))
        forwards = self._forwards_s(len(states), len(tokens) + 2)
        seconds = [f + self.overhead_s for f in forwards[:-1]]
        self._add_draft_steps(seconds, tokens, states)
        best = max(range(len(seconds)), key=lambda n: gained[n] / seconds[n])  # (the first best)
        worth = tokens[best - 1][0] if best else math.inf
        rate = gained[best] / seconds[best]
        return Plan(worth, rate, rate * (forwards[best + 1] - forwards[best]), len(states))

    def _add_draft_steps(self, seconds: list[float], tokens: list[tuple[float, int, int]],
                         states: list[RequestState]) -> None:  # fmt: skip
        """plan()'s seconds with the first n tokens, plus the draft model's steps: it steps its
        whole batch as long as its longest draft."""
        drafting = [state.proposer == "draft_model" for state in states]
        if self.draft is None or not any(drafting):
            return
        step_s = self.draft.times(np.arange(1, len(states) + 1)).tolist()  # a step's seconds by batch
        steps = batch = 0
        for n, (_, i, j) in enumerate(tokens, start=1):
            if drafting[i]:
                steps, batch = max(steps, j + 1), batch + (j == 0)
            if batch:
                seconds[n] += steps * step_s[batch - 1]

    def _forwards_s(self, first: int, count: int) -> list[float]:
        """Seconds of the target forwards a round of the requests in flight takes, by the rows of
        all of them: first, first + 1, ... rows (count of them). In step (Lockstep) one forward carries
        them all. Under load they are out of step, and a forward carries those that are ready
        (ForwardCost.sequences of them): a round is then requests / sequences forwards of that
        share of the rows. Priced as one forward of all rows, drafts would sit past the matmul's
        block of rows, where a row costs little, while in the smaller forwards they actually join
        they push the rows past a block's edge, where the forward's time steps up. Priced by the
        share, the plan drafts where forwards are small and stops at a block's edge."""
        share = self._share()
        if share >= 1.0:
            return self.target.consecutive(first, count)
        return (self.target.times(share * np.arange(first, first + count)) / share).tolist()

    def _share(self) -> float:
        """The part of the requests in flight that one target forward carries, lately."""
        sequences, requests = self.target.sequences, len(self.requests)
        return 1.0 if sequences is None or requests == 0 else min(1.0, sequences / requests)

    def _probe_bar(self, state: RequestState, plan: Plan) -> float:
        """Expected tokens a one-token probe must bring to pay: its row of the target's forward,
        and for the draft model also the draft forward that catches up with the tokens since its
        last call (at least one a round without drafts) and drafts the token. Priced as a row
        only, a draft model whose probes are rarely accepted would probe every few rounds and
        cost a sizeable share of throughput at low load."""
        if state.proposer != "draft_model" or self.draft is None:
            return plan.bar
        return plan.bar + plan.rate * self.draft.time(state.rounds_without_drafts + 1)

    # --- observations -----------------------------------------------------------------------------
    def observe(self, key: str, drafted: int, accepted: int) -> None:
        """The round decided last for the request (with its evidence) drafted and got accepted."""
        state = self.requests.get(key)
        if state is None or not drafted:
            return
        state.drafts.observe(drafted, accepted, state.evidence, 1.0 - self.options.ema_alpha)
        # the proposer's counts forget at the same pace per round, however many requests report
        decay = 1.0 - self.options.ema_alpha / len(self.requests)
        self.recent.setdefault(state.pool, Acceptance()).observe(drafted, accepted, state.evidence, decay)

    def observe_round(self, seconds: float) -> None:
        """A request's round took `seconds` from one round's tokens to the next's. Beyond the
        target's forward a served round costs the same again whatever its draft rows: the calls
        through Triton, the responses streamed, the server's other processes taking the cores
        between forwards (at one user on a CPU engine, a large fraction of a step). Drafts spread it
        over more tokens, so the plan counts it; it is followed as the rounds' average excess over
        the forward time the cost model gives for the rows in flight."""
        if self.target is None or not self.requests:
            return
        rows = sum(s.k + 1 for s in self.requests.values())
        excess = max(seconds - self._forwards_s(rows, 1)[0], 0.0)
        self.overhead_s += self.options.ema_alpha / len(self.requests) * (excess - self.overhead_s)

    def mean_k(self, proposer: str) -> float:
        ks = [s.k for s in self.requests.values() if s.proposer == proposer]
        return sum(ks) / len(ks) if ks else 0.0


def calibration_path(build_dir: Path, model: str) -> Path:
    return build_dir / "calibration" / f"{model}.json"


def calibration_cache_dir(build_dir: Path) -> Path:
    """Where engines keep their start-up calibrations by key (specdec.engine.Engine.calibrated):
    beside the build folder, shared by the builds there."""
    return build_dir.parent / "calibration-cache"
