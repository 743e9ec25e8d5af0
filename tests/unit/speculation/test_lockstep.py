"""Rounds in step (specdec/speculation/lockstep.py), against a simulated engine that batches the calls
queued when it starts a forward, as Triton's dynamic batcher does."""

from __future__ import annotations

import asyncio

from specdec.speculation.lockstep import Lockstep, send_each

QUEUE_DELAY_S = 0.001


def bandwidth_bound(rows: int) -> float:
    """A forward costs its weight reads, whatever the rows: merging calls saves whole forwards."""
    return 0.02 + 0.001 * rows


def compute_bound(rows: int) -> float:
    """Every row costs the same: merging saves nothing."""
    return 0.02 * rows


class SimulatedEngine:
    """One forward at a time over every call queued when it starts (after the queue delay)."""

    def __init__(self, forward_s=bandwidth_bound):
        self.forward_s = forward_s
        self.queue: list[tuple[str, asyncio.Future]] = []
        self.batches: list[list[str]] = []
        self.worker: asyncio.Task | None = None

    async def call(self, member: str) -> None:
        done = asyncio.get_running_loop().create_future()
        self.queue.append((member, done))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._run())
        await done

    async def _run(self) -> None:
        while self.queue:
            await asyncio.sleep(QUEUE_DELAY_S)
            batch, self.queue = self.queue, []
            self.batches.append([name for name, _ in batch])
            await asyncio.sleep(self.forward_s(len(batch)))
            for _, done in batch:
                done.set_result(None)


async def member(lockstep: Lockstep, engine: SimulatedEngine, name: str, rounds: int, between_s: float,
                 start_s: float = 0.0) -> None:  # fmt: skip
    await asyncio.sleep(start_s)
    with lockstep.member() as me:
        for _ in range(rounds):
            await lockstep.call(me, 1, lambda: engine.call(name))
            await asyncio.sleep(between_s)  # accepting, streaming, proposing


def run_members(max_wait_s: float, specs: list[tuple[str, int, float, float]], forward_s=bandwidth_bound):
    lockstep, engine = Lockstep(max_wait_s, forward_s), SimulatedEngine(forward_s)

    async def main():
        await asyncio.gather(*(member(lockstep, engine, *spec) for spec in specs))

    asyncio.run(main())
    assert (lockstep.members, lockstep.in_engine, lockstep.ready) == (set(), 0, [])
    return engine.batches


def test_requests_out_of_step_take_turns_without_it_and_share_forwards_with_it():
    # the second request arrives during the first one's forward: out of step from its first call
    specs = [("a", 20, 0.003, 0.0), ("b", 20, 0.003, 0.005)]
    alone = run_members(0.0, specs)
    assert max(len(b) for b in alone) == 1, alone  # they take turns, every forward carries one
    together = run_members(0.05, specs)
    assert sum(len(b) == 2 for b in together) >= 18, together
    assert len(together) <= 22


def test_calls_go_at_once_where_merging_saves_nothing():
    specs = [("a", 10, 0.003, 0.0), ("b", 10, 0.003, 0.005)]
    batches = run_members(0.05, specs, forward_s=compute_bound)
    assert max(len(b) for b in batches) == 1, batches


def test_a_slow_member_holds_the_others_back_by_at_most_the_idle_wait():
    # "slow" spends 0.5 s between its rounds (say, drafting); the fast ones go after the idle wait
    batches = run_members(0.005, [("slow", 2, 0.5, 0.0), ("x", 30, 0.002, 0.0), ("y", 30, 0.002, 0.0)])
    fast_only = [b for b in batches if "slow" not in b]
    assert len(fast_only) >= 25
    assert all(sorted(b) == ["x", "y"] for b in fast_only[1:])


def test_a_member_that_leaves_releases_the_calls_waiting_for_it():
    async def main():
        lockstep, engine = Lockstep(60.0, bandwidth_bound), SimulatedEngine()
        leave = asyncio.Event()

        async def idle_member():
            with lockstep.member():
                await leave.wait()

        idle = asyncio.create_task(idle_member())
        waiting = asyncio.create_task(member(lockstep, engine, "a", 1, 0.0))
        await asyncio.sleep(0.05)
        assert not waiting.done() and len(lockstep.ready) == 1  # waiting for the idle member
        leave.set()
        await asyncio.wait_for(asyncio.gather(idle, waiting), timeout=5)
        assert engine.batches == [["a"]]

    asyncio.run(main())


def test_a_call_cancelled_while_waiting_leaves_nothing_behind():
    async def main():
        lockstep, engine = Lockstep(60.0, bandwidth_bound), SimulatedEngine()
        other_may_go = asyncio.Event()

        async def other():
            with lockstep.member() as me:
                await other_may_go.wait()
                await lockstep.call(me, 1, lambda: engine.call("other"))

        other_task = asyncio.create_task(other())
        cancelled = asyncio.create_task(member(lockstep, engine, "a", 1, 0.0))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert (len(lockstep.members), lockstep.in_engine, lockstep.ready) == (1, 0, [])
        other_may_go.set()  # now alone: its call goes at once
        await asyncio.wait_for(other_task, timeout=5)
        assert engine.batches == [["other"]]

    asyncio.run(main())


def test_released_calls_are_all_sent_in_one_go():
    """The calls of a round leave together: handed to send_together at once, inside the release,
    before the loop does anything else (a call sent late misses the engine's batch)."""

    async def main():
        groups = []

        def send_together(sends):
            groups.append(len(sends))
            return send_each(sends)

        lockstep, sent = Lockstep(60.0, bandwidth_bound, send_together), []

        def send(name: str):
            sent.append(name)
            return asyncio.sleep(0, result=name)

        with lockstep.member() as a, lockstep.member() as b, lockstep.member() as c:
            early = [asyncio.create_task(lockstep.call(m, 1, lambda n=n: send(n))) for m, n in ((a, "a"), (b, "b"))]
            await asyncio.sleep(0.01)
            assert sent == [] and len(lockstep.ready) == 2  # waiting for c
            last = asyncio.create_task(lockstep.call(c, 1, lambda: send("c")))
            await asyncio.sleep(0)  # c's call() runs up to its first wait: the release
            assert sent == ["a", "b", "c"] and groups == [3] and lockstep.in_engine == 3
            assert await asyncio.gather(*early, last) == ["a", "b", "c"]
        assert (lockstep.members, lockstep.in_engine, lockstep.ready) == (set(), 0, [])

    asyncio.run(main())


def test_a_call_that_cannot_be_sent_fails_alone():
    async def main():
        lockstep = Lockstep(60.0, bandwidth_bound)

        def broken():
            raise RuntimeError("no request")

        with lockstep.member() as a, lockstep.member() as b:
            bad = asyncio.create_task(lockstep.call(a, 1, broken))
            good = asyncio.create_task(lockstep.call(b, 1, lambda: asyncio.sleep(0, result="b")))
            results = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(results[0], RuntimeError) and results[1] == "b"
        assert (lockstep.in_engine, lockstep.ready) == (0, [])

    asyncio.run(main())
