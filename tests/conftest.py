"""Shared fixtures: tiny random Llama checkpoints, the embedded build, a real tritonserver."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from specdec.build.random_weights import write_random_llama
from specdec.engine.ops import BF16_OPS, CpuBf16Ops, bf16_unsupported

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 96,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "eos_token_id": 1,
}


def write_tiny_llama(path: Path, seed: int = 0, scale: float = 1.0, **overrides) -> Path:
    """A random-weight Llama of TINY's shape (overrides change it): exactness must hold for any
    weights, so these are honest tests of the loop; scale sharpens or flattens the logits."""
    return write_random_llama(path, {**TINY, **overrides}, seed, scale)


def write_guess_head(path: Path, seed: int = 3, width: int = 32) -> dict[str, torch.Tensor]:
    """A random guess head (specdec/engine/guess.py) for the tiny Llama; its weights."""
    g = torch.Generator().manual_seed(seed)
    size = TINY["hidden_size"]
    weights = {
        "fc1.weight": torch.randn(width, 2 * size, generator=g) / 8,
        "fc1.bias": torch.randn(width, generator=g) / 8,
        "fc2.weight": torch.randn(size, width, generator=g) / 4,
        "fc2.bias": torch.randn(size, generator=g) / 4,
        "candidates": torch.tensor([5, 9, 40, 41, 70]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path))
    return weights


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


# Test servers running now, and what became of those that died: CI's output is all there is to
# read once a clean clone's build folder is gone.
_RUNNING_SERVERS: list = []
_DEATHS: list[str] = []


@contextlib.contextmanager
def variant_server(base, smollm_dir: Path, name: str, draft_layers: int = 4, **updates):
    """A server of its own for a variant profile, on free ports of 127.0.0.1."""
    from specdec.serve import Ports, TritonServer

    with TritonServer(variant_profile(base, smollm_dir, name, draft_layers, **updates), ports=Ports.free()) as srv:
        _RUNNING_SERVERS.append(srv)
        try:
            yield srv
        finally:
            _RUNNING_SERVERS.remove(srv)


def _restart_dead_servers(test: str) -> bool:
    """Start again each test server found dead (tritonserver or one of its Python stubs), as
    `specdec serve` would, keeping what died and the log's tail for the summary. Whether there
    was one."""
    found = False
    for srv in list(_RUNNING_SERVERS):
        if failure := srv.failure():
            found = True
            _DEATHS.append(f"{srv.profile.name}: {failure}, found when {test} failed; its log ends:\n"
                           f"{srv.log_tail(60)}")  # fmt: skip
            srv.restart()
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that fails because a test server died runs once more on it restarted. Triton 2.51's
    Python backend can abort the whole server under concurrent BLS calls (README, operations,
    "tritonserver dies"): that is the server's supervision's to handle (`specdec serve`), not
    what the test checks. The death is reported at the end of the run; a second one fails the
    test."""
    try:
        return (yield)
    except (Exception, pytest.fail.Exception):
        if not _restart_dead_servers(item.nodeid):
            raise
        _DEATHS.append(f"{item.nodeid} ran again on the restarted server")
        return item.runtest()


def pytest_terminal_summary(terminalreporter):
    if _DEATHS:
        terminalreporter.write_sep("=", "test servers that died")
        for line in _DEATHS:
            terminalreporter.write_line(line)


# Only CPUs with AMX or AVX-512 BF16 run a bf16 engine (and pick it for dtype auto); on others
# these tests cannot run.
_BF16_UNAVAILABLE = bf16_unsupported()
needs_bf16 = pytest.mark.skipif(_BF16_UNAVAILABLE is not None, reason=f"bf16 engine: {_BF16_UNAVAILABLE}")
needs_amx = pytest.mark.skipif(CpuBf16Ops.unsupported() is not None, reason=f"AMX: {CpuBf16Ops.unsupported()}")
# Each CPU engine with bf16 products, as a test parameter: skipped on a CPU that cannot run it.
BF16_OPS_PARAMS = [
    pytest.param(
        ops, id=ops.__name__, marks=pytest.mark.skipif(ops.unsupported() is not None, reason=str(ops.unsupported()))
    )
    for ops in BF16_OPS
]


def with_dtype(profile, dtype: str) -> dict:
    """variant_profile's update for the engine computing in `dtype`."""
    return {"engine": profile.engine.model_copy(update={"dtype": dtype})}


@pytest.fixture(scope="session")
def server(embedded_profile, smollm_dir):
    """One real tritonserver for the whole session, on free ports of 127.0.0.1, drafting what
    each request asks (fixed_drafts). In float32, so that its tokens can be compared with
    transformers' float32 greedy decoding; test_server.py checks the bfloat16 engine too."""
    with variant_server(embedded_profile, smollm_dir, "test-shared", **with_dtype(embedded_profile, "float32")) as srv:
        yield srv
