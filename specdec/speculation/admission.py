"""Which requests run now, which wait, which are refused; and the drain before a shutdown.

At most `max_inflight` sequences run (the engines hold a KV-cache slot for each), up to
`max_queue` more wait in FIFO order, and beyond that a request is refused at once.

Shutdown: after SIGTERM, Triton 2.51 refuses every new inference request, BLS calls and the
ensemble's own steps included, so a request still generating can neither continue nor send its
last response through postprocessing. `specdec serve` therefore drains first, through a file in
the build folder that spec_decode reads: "drain" refuses new requests while in-flight ones
finish; "cancel" then stops those left at their next round (they end with UNAVAILABLE); only
when none is in flight does tritonserver get its SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

DRAIN, CANCEL = "drain", "cancel"
# How stale Admission.state() may be. Every request asks at every round: at many users, reading
# the file each time would be a noticeable share of spec_decode's busy time.
STATE_CHECK_S = 0.02


class Overloaded(RuntimeError):
    """More requests than the server runs and queues ("overloaded"), or a server shutting down
    ("shutdown"): `reason`."""

    def __init__(self, message: str, reason: str = "overloaded"):
        super().__init__(message)
        self.reason = reason


def drain_path(build_dir: Path) -> Path:
    return build_dir / "draining"


def drain_state(path: Path) -> str:
    """ "" while serving normally, DRAIN, or CANCEL."""
    # os.access says "no file" without raising: a failed open raising FileNotFoundError costs
    # far more, and rounds ask many times a second
    if not os.access(path, os.F_OK):
        return ""
    try:
        return path.read_text().strip()
    except FileNotFoundError:  # removed since
        return ""


class Admission:
    """on_change(running, queued) is called whenever either count changes, on_refused(reason)
    with each refusal's Overloaded.reason."""

    def __init__(
        self,
        max_inflight: int,
        max_queue: int,
        drain_file: Path | None = None,
        on_change: Callable[[int, int], None] = lambda running, queued: None,
        on_refused: Callable[[str], None] = lambda reason: None,
    ):
        self.max_inflight, self.max_queue = max_inflight, max_queue
        self.drain_file = drain_file
        self.on_change, self.on_refused = on_change, on_refused
        self._state, self._checked = "", -math.inf
        self.active = 0
        self._queue: deque[asyncio.Future] = deque()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Running and waiting requests."""
        return self.active + len(self._queue)

    def _changed(self) -> None:
        self.on_change(self.active, len(self._queue))

    def state(self) -> str:
        """drain_state() of the drain file, read at most every STATE_CHECK_S."""
        now = time.monotonic()
        if self.drain_file and now - self._checked >= STATE_CHECK_S:
            self._state, self._checked = drain_state(self.drain_file), now
        return self._state

    @contextlib.asynccontextmanager
    async def admitted(self):
        if self.state():
            self.on_refused("shutdown")
            raise Overloaded("server shutting down: not accepting new requests", "shutdown")
        if self.active < self.max_inflight:
            self.active += 1
            self._changed()
        else:
            if len(self._queue) >= self.max_queue:
                self.on_refused("overloaded")
                raise Overloaded(
                    f"server busy: {self.active} requests in flight and {len(self._queue)} queued; retry later"
                )
            place = asyncio.get_running_loop().create_future()
            self._queue.append(place)
            self._changed()
            try:
                await place  # a finishing request hands its place over
            except asyncio.CancelledError:
                if not place.done():
                    self._queue.remove(place)
                    self._changed()
                    raise
                self._hand_over()
                raise
        try:
            yield
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        while self._queue:
            place = self._queue.popleft()
            if not place.done():
                place.set_result(None)
                self._changed()
                return
        self.active -= 1
        self._changed()
