"""Servers for tests: variants of the embedded profile, each a real tritonserver of its own."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path


def fixed_drafts(profile):
    """The profile's speculation with the adaptive controller off: every round drafts what the
    request asks. The controller would (rightly) stop drafting with the 4-layer draft, which
    agrees with the target a few percent of the time; tests of exactness need the drafts made."""
    spec = profile.speculation
    return spec.model_copy(update={"adaptive": spec.adaptive.model_copy(update={"enabled": False})})


def variant_profile(base, smollm_dir: Path, name: str, draft_layers: int = 4, **updates):
    """The embedded model under another name (its own build folder, the weights used in place,
    drafts of the requested length), built, for tests that need a server of their own."""
    from specdec.build import build
    from specdec.config import ModelSource

    profile = base.model_copy(
        update={
            "name": name,
            "target": ModelSource(hf_dir=str(smollm_dir)),
            "draft": ModelSource(hf_dir=str(smollm_dir), num_layers=draft_layers),
            "speculation": fixed_drafts(base),
            **updates,
        }
    )
    build(profile)
    return profile


def wait_for(condition, timeout: float = 10.0, interval: float = 0.1) -> bool:
    """Whether condition() came true within `timeout` seconds (asked every `interval`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


# Test servers running now: a test that fails with one of them dead fails with its log (conftest.py).
RUNNING_SERVERS: list = []


@contextlib.contextmanager
def variant_server(base, smollm_dir: Path, name: str, draft_layers: int = 4, **updates):
    """A server of its own for a variant profile, on free ports of 127.0.0.1."""
    from specdec.triton.serve import Ports, TritonServer

    with TritonServer(variant_profile(base, smollm_dir, name, draft_layers, **updates), ports=Ports.free()) as srv:
        RUNNING_SERVERS.append(srv)
        try:
            yield srv
        finally:
            RUNNING_SERVERS.remove(srv)


def internal_client(server):
    """A client of the server's internal models (spec_decode's token ids, the engines): on
    tritonserver's own endpoint, with the key of its start (specdec/triton/internal.py)."""
    from specdec.client.client import TritonClient

    return TritonClient(server.internal.grpc_url, internal_key=server.internal.key)


def with_dtype(profile, dtype: str) -> dict:
    """variant_profile's update for the engine computing in `dtype`."""
    return {"engine": profile.engine.model_copy(update={"dtype": dtype})}
