"""Admission: running and queued counts as they change, refusals with their reason."""

from __future__ import annotations

import asyncio

import pytest

from specdec.speculation.admission import DRAIN, STATE_CHECK_S, Admission, Overloaded


def test_counts_follow_each_request_and_refusals_name_their_reason(tmp_path):
    changes, refusals = [], []
    admission = Admission(1, 1, tmp_path / "draining", on_change=lambda r, q: changes.append((r, q)),
                          on_refused=refusals.append)  # fmt: skip

    async def main():
        release = asyncio.Event()

        async def request():
            async with admission.admitted():
                await release.wait()

        first, second = asyncio.ensure_future(request()), asyncio.ensure_future(request())
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as busy:
            async with admission.admitted():
                pass
        assert busy.value.reason == "overloaded"
        release.set()
        await asyncio.gather(first, second)
        (tmp_path / "draining").write_text(DRAIN)
        await asyncio.sleep(STATE_CHECK_S)  # the drain file is read again
        with pytest.raises(Overloaded) as draining:
            async with admission.admitted():
                pass
        assert draining.value.reason == "shutdown"

    asyncio.run(main())
    assert changes == [(1, 0), (1, 1), (1, 0), (0, 0)]  # started, queued, handed over, ended
    assert refusals == ["overloaded", "shutdown"]
