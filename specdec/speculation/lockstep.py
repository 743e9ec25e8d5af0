"""Rounds in step: the requests in flight send their target calls together when one forward pass
over all of them costs less than the forwards they would otherwise take turns in.

The engine batches the calls that reach it together (Triton's dynamic batcher hands the calls
queued within its short delay to one execute()). Between two rounds a request spends a few
milliseconds in the spec_decode process (accepting, streaming, proposing); a call that arrives
while a forward runs goes into the next forward alone, the others' calls arrive just after that
one started, and from then on the requests take turns: at 2 in flight each forward carries one
of them, though a forward over 2 rows costs about what one row does: in turns they take twice
the forwards they need.

So a ready call may wait for the members that are not ready (in the engine, or between rounds),
when merging them into one forward saves more than the wait costs: T(ready) + T(missing) -
T(ready + missing) > the wait, with T the engine's forward time by rows (the controller's cost
model) and the wait the recent average time from the engine going idle to the last member being
ready. A bound, `max_idle_wait_s`, caps each wait. Where rows cost their full price (many in
flight, or a compute-bound CPU), turns are cheaper than the idle engine, and calls go at once.

The calls released together leave as one where the engine takes calls of several rows
(`send_together`: the PyTorch engine's client): sent one by one, a round's many calls can reach
the engine over more than its batcher's delay and take two forward passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

WAIT_EMA = 0.2  # weight of the latest observed wait in the average


@dataclass(eq=False)  # members are told apart by identity
class Member:
    rows: int = 1  # rows of its latest call: what merging with it adds to a forward
    state: str = "between"  # "between" rounds, "ready" (its call waits here), "engine"


Send = Callable[[], Awaitable]  # a call built beforehand: calling it sends it


def send_each(sends: list[Send]) -> list[Awaitable | Exception]:
    """Send calls one by one: each one's result, or the exception that kept it from being sent."""
    sent: list[Awaitable | Exception] = []
    for send in sends:
        try:
            sent.append(send())
        except Exception as err:  # fails this call only
            sent.append(err)
    return sent


class Lockstep:
    def __init__(
        self,
        max_idle_wait_s: float,
        forward_s: Callable[[int], float],
        send_together: Callable[[list[Send]], list[Awaitable | Exception]] = send_each,
    ):
        """forward_s(rows): the engine's seconds for a forward over that many rows (0 while
        unknown: no saving, calls go at once). send_together: sends the calls released together
        (the engine client's sends them as one call where its engine takes that)."""
        self.max_idle_wait_s = max_idle_wait_s
        self.forward_s = forward_s
        self.send_together = send_together
        self.members: set[Member] = set()
        self.ready: list[tuple[Member, asyncio.Future, Send]] = []  # (member, turn, send)
        self.expected_wait_s = 0.0  # learnt from the waits it takes
        self._timer: asyncio.TimerHandle | None = None  # set while ready calls wait, the engine idle
        self._waiting_since = 0.0

    @property
    def in_engine(self) -> int:
        return sum(m.state == "engine" for m in self.members)

    @contextmanager
    def member(self) -> Iterator[Member]:
        """One request's life: the others may wait for its calls while it lasts."""
        member = Member()
        self.members.add(member)
        try:
            yield member
        finally:
            self.members.discard(member)
            self._check()

    async def call(self, member: Member, rows: int, send: Callable[[], Awaitable[T]]) -> T:
        """Run a target call of `rows` rows in step with the other members' calls. send(), the
        call built beforehand, is sent when the call is released: the released calls leave
        together, in one go of the event loop (send_together)."""
        member.rows = rows
        turn: asyncio.Future[asyncio.Future[T]] = asyncio.get_running_loop().create_future()
        member.state = "ready"
        self.ready.append((member, turn, send))
        self._check()
        try:
            sent = await turn  # the member is "engine" from its release on
        except BaseException:  # cancelled, or its call could not be sent
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                turn.result().cancel()  # sent, but cancelled before it resumed: nobody awaits it
            self.ready = [entry for entry in self.ready if entry[1] is not turn]
            member.state = "between"
            self._check()
            raise
        try:
            return await sent
        finally:
            member.state = "between"
            self._check()

    def _worth_waiting(self) -> bool:
        """Does merging the missing members into the next forward save more than waiting for them
        is expected to cost?"""
        if self.max_idle_wait_s <= 0:
            return False
        ready = sum(m.rows for m, _, _ in self.ready)
        missing = sum(m.rows for m in self.members if m.state != "ready")
        saving = self.forward_s(ready) + self.forward_s(missing) - self.forward_s(ready + missing)
        return saving > self.expected_wait_s

    def _check(self) -> None:
        if not self.ready:
            self._cancel_timer()
        elif len(self.ready) == len(self.members) or not self._worth_waiting():
            self._release()
        elif self.in_engine:
            self._cancel_timer()  # the missing ones are in the engine: wait for their results
        elif self._timer is None:
            self._waiting_since = time.monotonic()
            self._timer = asyncio.get_running_loop().call_later(self.max_idle_wait_s, self._release)

    def _release(self) -> None:
        if self._timer is not None:  # the ready calls waited, the engine idle: the price of waiting
            waited = min(time.monotonic() - self._waiting_since, self.max_idle_wait_s)
            self.expected_wait_s += WAIT_EMA * (waited - self.expected_wait_s)
            self._cancel_timer()
        released, self.ready = self.ready, []
        sent = self.send_together([send for _, _, send in released])
        for (member, turn, _), call in zip(released, sent, strict=True):
            member.state = "engine"
            if isinstance(call, Exception):  # fails this member's call only
                turn.set_exception(call)
            else:
                turn.set_result(asyncio.ensure_future(call))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
