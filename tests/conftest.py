"""Shared fixtures: tiny random Llama checkpoints, the embedded build, a real tritonserver; and
what a test that fails with a dead test server shows (its log)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.models import write_guess_head, write_tiny_llama
from support.servers import RUNNING_SERVERS, variant_server, with_dtype


@pytest.fixture(scope="session")
def tiny_guess_head(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("guess") / "head.safetensors"
    write_guess_head(path)
    return path


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "target", seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    """Same vocabulary, one layer, different weights: a cheap, often-wrong draft."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "draft", seed=1, num_hidden_layers=1)


@pytest.fixture(scope="session")
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# --- the real model and server ------------------------------------------------------------------
@pytest.fixture(scope="session")
def embedded_profile():
    from specdec.build import build
    from specdec.config import load_profile

    profile = load_profile()
    build(profile)
    return profile


@pytest.fixture(scope="session")
def smollm_dir(embedded_profile) -> Path:
    return embedded_profile.model_dir("target")


@pytest.fixture(scope="session")
def tokenizer(smollm_dir):
    from specdec.tokenizer import TextTokenizer

    return TextTokenizer(smollm_dir)


@pytest.fixture(scope="session")
def server(embedded_profile, smollm_dir):
    """One real tritonserver for the whole session, on free ports of 127.0.0.1, drafting what
    each request asks (fixed_drafts). In float32, so that its tokens can be compared with
    transformers' float32 greedy decoding; test_server.py checks the bfloat16 engine too."""
    with variant_server(embedded_profile, smollm_dir, "test-shared", **with_dtype(embedded_profile, "float32")) as srv:
        yield srv


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that fails with a test server dead (tritonserver, or one of its Python stubs) fails
    with what died and the end of the server's log attached; the server is started again for the
    tests after it, as `specdec serve` would, and nothing runs twice."""
    try:
        return (yield)
    except (Exception, pytest.fail.Exception) as err:
        dead = [(srv, failure) for srv in list(RUNNING_SERVERS) if (failure := srv.failure())]
        if not dead:
            raise
        logs = "\n".join(f"{srv.profile.name}: {failure}; its log ends:\n{srv.log_tail(60)}" for srv, failure in dead)
        for srv, _ in dead:
            srv.restart(graceful=srv.can_finish_requests())
        raise AssertionError(f"{err}\n\nthe test server died during the test:\n{logs}") from err


def pytest_collection_modifyitems(items):
    """Every test under tests/server/ runs a real tritonserver: marked `server` (-m "not server"
    runs the rest)."""
    server = Path(__file__).parent / "server"
    for item in items:
        if server in Path(item.fspath).parents:
            item.add_marker(pytest.mark.server)
