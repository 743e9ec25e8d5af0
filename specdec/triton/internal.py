"""Internal models refuse outside calls: only the ensemble is the clients'.

preprocessing, spec_decode, postprocessing and the engine models (`target`, `draft`) serve the
ensemble and spec_decode's BLS calls. Called directly, spec_decode would skip the ensemble's
checks (preprocessing's), an engine model would skip admission and could evict other requests'
KV slots (specdec/engine/kv_slots.py), and postprocessing relays cancellations. Triton 2.51 cannot
tell those calls apart by itself: an ensemble step's request carries the client's own request id,
correlation id, flags and parameters (specdec/build/triton_access.py ENSEMBLE_STEP_REQUEST), and its
restricted APIs are whole categories, not models. So each start of the server draws a key
(`new_key`), which reaches the models in the environment (KEY_ENV), and:

- a BLS call carries the key as a request parameter (KEY_PARAMETER): spec_decode's calls to the
  engines and postprocessing's relayed cancellations. Local operators (tests, `specdec check`)
  read it from the server's access file (`write_access_file`, readable by the server's user only);
- an ensemble step, whose inputs are only what the ensemble maps, carries a tag (TAG): an HMAC
  under the key over exactly what the step before it handed on. preprocessing tags the checked
  request it hands spec_decode (`checked_tag`); spec_decode tags the sequence id it hands
  postprocessing (`sequence_tag`), so that no one else can have a sequence's cancellation relayed.
  A tag authorizes nothing but the tensors it was computed over, for one purpose each;
- preprocessing itself is the ensemble's first step: its request is indistinguishable from a
  direct call, so it cannot refuse one. A direct call to it only checks and tokenizes, and its tag
  covers exactly what it checked. The server's edge (specdec/triton/edge.py) serves clients the
  ensemble's inference only.

The key never leaves the server's processes: no response carries it, and tags are HMACs under it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KEY_ENV = "SPECDEC_INTERNAL_KEY"  # the key of this start, in tritonserver's (and its stubs') environment
KEY_PARAMETER = "specdec_internal_key"  # the request parameter a sanctioned direct call carries
TAG = "internal_tag"  # the tensor (UINT8 [32]) a tagged ensemble step carries
TAG_BYTES = 32  # HMAC-SHA256
# What preprocessing hands spec_decode, under spec_decode's input names (the ensemble's input_map):
# its tag covers these, and spec_decode takes them only under a tag that matches.
CHECKED_INPUTS = ("input_ids", "input_lengths", "max_tokens", "end_id", "stop_words_list")
# A tag's purpose goes into its HMAC: one made for spec_decode never passes at postprocessing.
FOR_SPEC_DECODE, FOR_POSTPROCESSING = b"checked request", b"sequence"


class NoKey(RuntimeError):
    """The server was started without a key: its internal models cannot serve the ensemble."""


def new_key() -> str:
    """A fresh key, drawn at each start of the server: 32 random bytes, hex."""
    return secrets.token_hex(32)


def key_from_environment(environ: Mapping[str, str] = os.environ) -> bytes:
    """The key of this start (KEY_ENV); NoKey when absent or short. Models read it at load."""
    key = environ.get(KEY_ENV, "")
    if len(key) < 32:
        raise NoKey(
            f"{KEY_ENV} is not set: internal models need the key the server draws at each start "
            "(start it with `specdec serve`, or specdec.triton.serve.TritonServer)"
        )
    return key.encode()


def refusal(model: str) -> str:
    """The error a refused outside call gets."""
    return f"{model}: internal model; clients call the ensemble"


def carries_key(parameters: str, key: bytes) -> bool:
    """Whether a request's parameters (the JSON object Triton's Python backend gives) carry the
    key. A parameter that is not a string, or JSON that is not an object, carries none."""
    if KEY_PARAMETER not in parameters:  # most calls: no JSON to parse
        return False
    try:
        value = json.loads(parameters).get(KEY_PARAMETER)
    except (ValueError, AttributeError):
        return False
    return isinstance(value, str) and hmac.compare_digest(value.encode(), key)


def tag(key: bytes, purpose: bytes, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """HMAC-SHA256 under `key` of `purpose` and `tensors` (one request's, without a batch
    dimension), as UINT8 [32]. Each tensor enters by name, dtype, shape and bytes, length-prefixed
    and in name order, so that no two different sets of tensors share an encoding."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(len(purpose).to_bytes(4, "little") + purpose)
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        header = f"{name}\0{arr.dtype.str}\0{','.join(map(str, arr.shape))}".encode()
        mac.update(len(header).to_bytes(4, "little") + header + arr.nbytes.to_bytes(8, "little"))
        mac.update(arr.tobytes())
    return np.frombuffer(mac.digest(), dtype=np.uint8).copy()


def checked_tag(key: bytes, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """preprocessing's tag over the checked request it hands spec_decode (CHECKED_INPUTS, under
    spec_decode's names; KeyError if one is missing)."""
    return tag(key, FOR_SPEC_DECODE, {name: inputs[name] for name in CHECKED_INPUTS})


def sequence_tag(key: bytes, sequence_id: int) -> np.ndarray:
    """spec_decode's tag over a sequence id it hands postprocessing."""
    return tag(key, FOR_POSTPROCESSING, {"sequence_id": np.array([sequence_id], dtype=np.uint64)})


def tag_matches(expected: np.ndarray, given: np.ndarray | None) -> bool:
    """Whether a request's TAG input (None: absent) is the expected tag."""
    if given is None:
        return False
    given = np.asarray(given)
    if given.dtype != np.uint8 or given.size != TAG_BYTES:
        return False
    return hmac.compare_digest(expected.tobytes(), given.tobytes())


def checked_request_tagged(key: bytes, inputs: Mapping[str, np.ndarray]) -> bool:
    """Whether spec_decode's inputs (batch dimension removed) carry preprocessing's tag over
    exactly the checked request among them."""
    if any(name not in inputs for name in CHECKED_INPUTS):
        return False
    return tag_matches(checked_tag(key, inputs), inputs.get(TAG))


# --- the access file: how a local operator reaches the internal models ---------------------------------
@dataclass(frozen=True)
class InternalAccess:
    """tritonserver's own endpoints (on 127.0.0.1, behind the edge) and the key of its start."""

    grpc_url: str
    http_url: str
    key: str


def access_path(build_dir: Path, grpc_port: int) -> Path:
    """Where a server on public gRPC port `grpc_port` keeps its InternalAccess: one file a server,
    so that servers of one build folder (replicas) do not overwrite each other's."""
    return build_dir / "internal" / f"{grpc_port}.json"


def write_access_file(path: Path, access: InternalAccess) -> None:
    """Write `access` readable by this user only (a folder 0700, a file 0600, created so: never
    world-readable, not even for a moment)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    staged = path.with_suffix(".tmp")
    staged.unlink(missing_ok=True)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"grpc_url": access.grpc_url, "http_url": access.http_url, "key": access.key}, f)
    os.replace(staged, path)


def read_access_file(path: Path) -> InternalAccess | None:
    """The InternalAccess in `path`; None when there is none this user can read."""
    try:
        data = json.loads(path.read_text())
        return InternalAccess(str(data["grpc_url"]), str(data["http_url"]), str(data["key"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
