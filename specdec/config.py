"""Deployment profiles: the YAML schema, its validation, and where a profile's build goes.

A profile is data only: it names files, packages and numbers, never code to import
(model sources are located on disk, not executed). Every error names the key path.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
DEFAULT_PROFILE = CONFIGS_DIR / "embedded.yaml"

ProposerName = Literal["ngram", "draft_model", "none"]
PROPOSERS: tuple[str, ...] = ("ngram", "draft_model", "none")


class ProfileError(ValueError):
    """A profile that cannot be used, with the key and the reason."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSource(_Strict):
    """Where a model's weights come from. Exactly one of gguf_package or hf_dir."""

    gguf_package: str | None = Field(None, description="pip package that ships the .gguf (located, never imported)")
    gguf_file: str | None = Field(None, description="file name of the .gguf inside that package")
    hf_dir: str | None = Field(None, description="local Hugging Face checkpoint directory (safetensors)")
    hf_repo: str | None = Field(
        None, description="Hugging Face repo id of hf_dir's checkpoint (named when it is missing)"
    )
    num_layers: Annotated[int, Field(ge=1)] | None = Field(
        None, description="keep only the first N decoder layers (a truncated draft)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if (self.gguf_package is None) == (self.hf_dir is None):
            raise ValueError("give exactly one of gguf_package or hf_dir")
        if self.gguf_package is not None and not self.gguf_file:
            raise ValueError("gguf_package needs gguf_file")
        return self


class PytorchEngine(_Strict):
    """The Python-backend PyTorch engine (CPU, or CUDA without TensorRT-LLM)."""

    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32", description="auto: bfloat16 on CUDA and on CPUs with AMX bf16 tiles or AVX-512 BF16, else float32"
    )
    max_batch_size: Annotated[int, Field(ge=1, le=256)] = 16
    max_seq_len: Annotated[int, Field(ge=16, le=131072)] = 2048
    kv_slots: Annotated[int, Field(ge=1, le=1024)] = 16
    threads: Annotated[int, Field(ge=1)] | None = Field(None, description="CPU threads; default: all cores")
    max_queue_delay_us: Annotated[int, Field(ge=0, le=1_000_000)] = 1000
    instances: Annotated[int, Field(ge=1, le=8)] = 1
    kv_cache_reuse: bool = Field(
        True, description="a new request reuses the keys/values of a prefix an ended one left (same cache_salt)"
    )


# --- TensorRT-LLM (backend: tensorrtllm). Names follow the pinned release: specdec/build/trtllm.py --------
TrtllmMode = Literal["draft_target", "ngram", "eagle3", "medusa", "lookahead", "redrafter"]
EXTERNAL_DRAFT_MODES: tuple[str, ...] = ("draft_target", "ngram")  # the spec_decode BLS proposes
IN_ENGINE_WEIGHTS = (("medusa", "heads"), ("eagle3", "draft"), ("redrafter", "drafter"))  # trtllm.<mode>.<key>


class GpuPlacement(_Strict):
    """Where one engine runs and how much of the free GPU memory its KV cache may take. On several
    nodes (a LeaderWorkerSet group, one pod a node) gpu_ids names one node's GPUs, the same on
    every node: tp_size * pp_size = nodes * len(gpu_ids)."""

    tp_size: Annotated[int, Field(ge=1, le=64)] = 1
    pp_size: Annotated[int, Field(ge=1, le=64)] = 1
    gpu_ids: list[Annotated[int, Field(ge=0)]] = [0]
    nodes: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="nodes the engine's ranks span, each with the GPUs gpu_ids names (>1: leader mode)"
    )
    kv_cache_free_gpu_mem_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9

    @property
    def gpus_per_node(self) -> int:
        return len(self.gpu_ids)

    @model_validator(mode="after")
    def _gpus_match_parallelism(self) -> GpuPlacement:
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ValueError(f"gpu_ids {self.gpu_ids} names a GPU twice")
        if self.nodes * len(self.gpu_ids) != self.tp_size * self.pp_size:
            on = f" on each of {self.nodes} nodes" if self.nodes > 1 else ""
            raise ValueError(
                f"tp_size * pp_size = {self.tp_size * self.pp_size} GPUs, but gpu_ids names {len(self.gpu_ids)} "
                f"({self.gpu_ids}){on}; name one GPU per rank"
            )
        return self


class MedusaOptions(_Strict):
    heads: ModelSource
    num_heads: Annotated[int, Field(ge=1, le=16)] = 4
    num_layers: Annotated[int, Field(ge=1, le=8)] = 1
    choices: list[list[Annotated[int, Field(ge=0)]]] = Field(
        description="the Medusa tree: each path lists, head by head, which top-k candidate to follow"
    )

    @model_validator(mode="after")
    def _tree_fits_heads(self) -> MedusaOptions:
        deepest = max((len(path) for path in self.choices), default=0)
        if not self.choices or deepest > self.num_heads:
            raise ValueError(f"choices must be non-empty paths of at most num_heads ({self.num_heads}) steps")
        paths = {tuple(path) for path in self.choices}
        orphans = [list(path) for path in paths if len(path) > 1 and path[:-1] not in paths]
        if orphans:
            raise ValueError(f"choices must be a tree: the parents of {sorted(orphans)} are missing")
        return self


class Eagle3Options(_Strict):
    draft: ModelSource = Field(
        description="the EAGLE-3 draft head checkpoint (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)"
    )
    one_model: bool = Field(True, description="run the draft head inside the target's model (eagle3_one_model)")


class LookaheadOptions(_Strict):
    window_size: Annotated[int, Field(ge=1, le=32)] = 4
    ngram_size: Annotated[int, Field(ge=1, le=32)] = 4
    verification_set_size: Annotated[int, Field(ge=0, le=32)] = 4

    def max_draft_len(self) -> int:
        """What TensorRT-LLM's lookahead decoding reserves for (W, N, G)."""
        w, n, g = self.window_size, self.ngram_size, self.verification_set_size
        return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


class RedrafterOptions(_Strict):
    drafter: ModelSource
    num_beams: Annotated[int, Field(ge=1, le=16)] = 5
    draft_len_per_beam: Annotated[int, Field(ge=1, le=16)] = 5


class TrtllmOptions(_Strict):
    """Engine builds and runtime settings for NVIDIA's tensorrtllm Triton backend."""

    mode: TrtllmMode
    max_input_len: Annotated[int, Field(ge=1, le=131072)] = 4096
    max_num_tokens: Annotated[int, Field(ge=1, le=1048576)] = 8192
    max_draft_len: Annotated[int, Field(ge=0, le=1024)] = Field(
        0, description="draft tokens the engine reserves per step (external modes: the most a request may ask)"
    )
    kv_cache_reuse: bool = True
    paged_context_fmha: bool = True
    draft_logits: bool = Field(True, description="the draft returns generation logits, so sampled requests are exact")
    passthrough_chunk: Annotated[int, Field(ge=1, le=4096)] = Field(
        32, description="in-engine modes: new tokens per engine call while streaming"
    )
    target: GpuPlacement = GpuPlacement()
    draft: GpuPlacement | None = None
    medusa: MedusaOptions | None = None
    eagle3: Eagle3Options | None = None
    lookahead: LookaheadOptions | None = None
    redrafter: RedrafterOptions | None = None

    @property
    def external(self) -> bool:
        return self.mode in EXTERNAL_DRAFT_MODES

    @model_validator(mode="after")
    def _consistent(self) -> TrtllmOptions:
        if self.kv_cache_reuse and not self.paged_context_fmha:
            raise ValueError("kv_cache_reuse needs paged_context_fmha: true (trtllm-build --use_paged_context_fmha)")
        for mode in ("medusa", "eagle3", "lookahead", "redrafter"):
            if (getattr(self, mode) is not None) != (self.mode == mode):
                raise ValueError(f"give the `{mode}` section exactly when mode is {mode} (mode is {self.mode})")
        if (self.draft is not None) != (self.mode == "draft_target"):
            raise ValueError("give `draft` (its GPUs and memory) exactly when mode is draft_target")
        if self.draft is not None and self.draft.nodes != 1:
            raise ValueError("draft.nodes must be 1: only the target's ranks may span nodes")
        if self.target.nodes > 1 and self.mode in ("draft_target", "eagle3"):
            # leader mode: every tensorrt_llm model's executor spans the whole MPI world, so a
            # second engine (the draft) or the LLM API's own launch (EAGLE-3) does not fit it
            raise ValueError(
                f"target.nodes > 1 (leader mode) serves one tensorrt_llm model: not mode {self.mode}; "
                "use an in-engine mode or ngram"
            )
        if self.draft is not None:
            shared = sorted(set(self.target.gpu_ids) & set(self.draft.gpu_ids))
            total = self.target.kv_cache_free_gpu_mem_fraction + self.draft.kv_cache_free_gpu_mem_fraction
            if shared and total > 1:
                raise ValueError(
                    f"target and draft share GPU {shared} but their kv_cache_free_gpu_mem_fraction add up to "
                    f"{total:g}: lower them so they sum to at most 1"
                )
        if self.mode == "lookahead" and self.lookahead and self.max_draft_len != self.lookahead.max_draft_len():
            raise ValueError(
                f"max_draft_len must be {self.lookahead.max_draft_len()} for lookahead "
                f"(W, N, G) = ({self.lookahead.window_size}, {self.lookahead.ngram_size}, "
                f"{self.lookahead.verification_set_size}), got {self.max_draft_len}"
            )
        if self.mode == "medusa" and self.medusa and self.max_draft_len < len(self.medusa.choices):
            raise ValueError(
                f"max_draft_len ({self.max_draft_len}) must cover the {len(self.medusa.choices)} nodes of "
                "medusa.choices"
            )
        if self.mode == "redrafter" and (self.target.pp_size != 1 or self.max_draft_len):
            raise ValueError(
                "redrafter: pp_size must be 1 and max_draft_len 0 (its drafts are sized by num_beams and "
                "draft_len_per_beam at conversion)"
            )
        if self.mode in ("eagle3", "draft_target", "ngram") and self.max_draft_len < 1:
            raise ValueError(f"mode {self.mode} needs max_draft_len >= 1")
        return self


# How far below its guess's score (in logits) the guess head still finds a token plausible
# (specdec/engine/guess.py, specdec/speculation/lookup.py). The built-in grounded prompts' greedy outputs
# replayed (benchmarks/copy_bound.py's way, drafts of 15), tokens a round at margins 0, 1, 2, 3,
# 4, 6, 8: 2.99, 3.02, 3.04, 3.08, 3.09, 3.09, 3.07 (held out: 2.91, 2.94, 2.98, 3.00, 3.00,
# 2.99, 2.98).
GUESS_MARGIN = 4.0


class NgramOptions(_Strict):
    min_n: Annotated[int, Field(ge=1, le=16)] = 1
    max_n: Annotated[int, Field(ge=1, le=16)] = 4
    guess_head: str | None = Field(
        None,
        description="backend pytorch: the target's guess head (.safetensors, `specdec train-guess-head`), "
        "whose guesses lead drafts where lookup matches little",
    )
    phrases: str | None = Field(
        None,
        description="a phrase index of the target's own outputs (.safetensors, written by `specdec "
        "train-guess-head`): where lookup matches little, a draft may come from the model's stock phrases",
    )
    opening: bool = Field(
        True,
        description="draft the prefill round from the user's text after its first blank line (the passage a "
        "grounded answer often opens by copying); needs the target's tokenizer and chat template",
    )
    guess_margin: Annotated[float, Field(ge=0)] = Field(
        GUESS_MARGIN,
        description="how far (in logits) below its guess the guess head still finds a token plausible: "
        "lookup prefers matches that go on with a plausible token, and a one-token match keeps the lead over "
        "the guess where its next token is plausible",
    )

    @model_validator(mode="after")
    def _order(self) -> NgramOptions:
        if self.min_n > self.max_n:
            raise ValueError(f"min_n ({self.min_n}) must be <= max_n ({self.max_n})")
        return self


class AdaptiveOptions(_Strict):
    """How the draft length follows acceptance and load (see specdec/speculation/controller.py)."""

    enabled: bool = Field(True, description="false: every request drafts exactly its num_draft_tokens")
    ema_alpha: Annotated[float, Field(gt=0, le=1)] = Field(
        0.05, description="weight of the newest round in a request's acceptance estimate"
    )
    min_draft_tokens: Annotated[int, Field(ge=0)] = 0
    prior_acceptance: Annotated[float, Field(ge=0, le=1)] = Field(
        0.5, description="assumed acceptance before a proposer has any history"
    )
    prior_weight: Annotated[float, Field(gt=0)] = Field(2.0, description="the prior counts as this many draft tokens")
    next_prior_weight: Annotated[float, Field(gt=0)] = Field(
        8.0, description="a request's next-token rate starts at its first-token rate, worth this many tokens"
    )
    hysteresis: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.1, description="keep k while the deciding token's worth is within this fraction of the bar"
    )
    probe_every: Annotated[int, Field(ge=1)] = Field(8, description="rounds without drafts before a 1-token probe")


class Speculation(_Strict):
    proposer: ProposerName = "ngram"
    num_draft_tokens: Annotated[int, Field(ge=0, le=64)] = 4
    max_draft_tokens: Annotated[int, Field(ge=1, le=64)] = 8
    ngram: NgramOptions = NgramOptions()
    adaptive: AdaptiveOptions = AdaptiveOptions()

    @model_validator(mode="after")
    def _bounds(self) -> Speculation:
        if self.num_draft_tokens > self.max_draft_tokens:
            raise ValueError(
                f"num_draft_tokens ({self.num_draft_tokens}) must be <= max_draft_tokens ({self.max_draft_tokens})"
            )
        return self


# --- tritonserver's security options (the facts: specdec/build/triton_flags.py; the flags they
# become: specdec/triton/server_flags.py) --------------------------------------------------------------
# tritonserver 2.51's restricted-API categories (src/restricted_features.h 52-57, v2.51.0; a unit
# test compares them with specdec/build/triton_flags.py's record)
RestrictedCategory = Literal[
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace",
    "logging",
]  # fmt: skip
# categories a profile may not restrict, and why (probes: docker/healthcheck.py, Kubernetes, balancers)
UNRESTRICTED = {"health": "health stays open: `specdec serve` waits on /v2/health/ready and probes ask it without "
                "a key (it tells only whether the server is live and ready)"}  # fmt: skip


def header_value_problem(value: str) -> str | None:
    """Why `value` cannot be a restricted API's header value, or None. gRPC metadata and HTTP
    header values are printable ASCII; HTTP drops spaces at either end, so a value with them
    would never match; tritonserver refuses an empty one."""
    if not value:
        return "is empty"
    if any(not (" " <= c <= "~") for c in value):
        return "must be printable ASCII (a header value)"
    if value != value.strip():
        return "must not begin or end with a space"
    return None


TLS_FILES = ("cert", "key", "ca_cert", "client_ca_cert", "client_cert", "client_key")  # TlsOptions' paths


class TlsOptions(_Strict):
    """TLS on tritonserver's gRPC endpoint. Paths may be relative to the profile's folder; each
    must exist when the server starts (tritonserver reads a missing file as empty, without error)."""

    cert: str = Field(description="the server's certificate, PEM (its chain after it): --grpc-server-cert")
    key: str = Field(description="its private key, PEM: --grpc-server-key")
    ca_cert: str | None = Field(
        None,
        description="the CA the bundle's own gRPC clients (the OpenAI frontend; `specdec` commands that start "
        "the profile's server) trust for the server; default: cert itself (a self-signed certificate)",
    )
    server_name: str | None = Field(
        None,
        description="the name in cert the bundle's own clients check it against, where cert does not name the "
        "address they connect to (127.0.0.1, or server.host)",
    )
    client_ca_cert: str | None = Field(
        None,
        description="mutual TLS: every client must present a certificate this CA signed "
        "(--grpc-use-ssl-mutual=true --grpc-root-cert)",
    )
    client_cert: str | None = Field(None, description="mutual TLS: the certificate the bundle's own clients present")
    client_key: str | None = Field(None, description="mutual TLS: its private key")
    https: bool = Field(False, description="TLS on the HTTP endpoint: tritonserver 2.51 has none (refused)")

    def files(self) -> dict[str, str]:
        """{key: path} of the files given."""
        return {key: path for key in TLS_FILES if (path := getattr(self, key)) is not None}

    @field_validator("https")
    @classmethod
    def _no_https(cls, https: bool) -> bool:
        if https:
            raise ValueError(
                "tritonserver 2.51's HTTP endpoint has no TLS (no such option; specdec/build/triton_flags.py "
                "HTTP_TLS): put a TLS-terminating proxy in front of the HTTP port, or use gRPC"
            )
        return https

    @model_validator(mode="after")
    def _mutual_complete(self) -> TlsOptions:
        own = (self.client_cert is not None, self.client_key is not None)
        if self.client_ca_cert is not None and own != (True, True):
            raise ValueError("client_ca_cert (mutual TLS) needs client_cert and client_key, for the bundle's own "
                             "clients (the OpenAI frontend)")  # fmt: skip
        if self.client_ca_cert is None and any(own):
            raise ValueError("client_cert and client_key go with client_ca_cert (mutual TLS)")
        return self


class RestrictedApi(_Strict):
    """A group of tritonserver APIs that answer only requests carrying a header with a value
    (--http-restricted-api / --grpc-restricted-protocol). Over gRPC the header a client sends is
    triton-grpc-protocol-<header>; over HTTP it is <header> itself."""

    protocol: Literal["http", "grpc"]
    apis: list[RestrictedCategory] = Field(min_length=1, description="the categories this group restricts")
    header: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=128)] = Field(
        description="the header's name: lower case (gRPC metadata keys are), letters, digits, - _ ."
    )
    value_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = Field(
        None, description="the environment variable that holds the header's value when the server starts (a secret "
        "does not belong in a profile)"
    )  # fmt: skip
    value: str | None = Field(None, description="the value itself (prefer value_env)")

    @model_validator(mode="after")
    def _valid(self) -> RestrictedApi:
        if (self.value is None) == (self.value_env is None):
            raise ValueError("give exactly one of value_env (an environment variable's name) or value")
        if self.value is not None and (problem := header_value_problem(self.value)):
            raise ValueError(f"value {problem}")
        if twice := sorted({a for a in self.apis if self.apis.count(a) > 1}):
            raise ValueError(f"apis names {twice} twice")
        for api, reason in UNRESTRICTED.items():
            if api in self.apis:
                raise ValueError(f"apis: {reason}")
        return self


class ExtraFlag(_Strict):
    """Another tritonserver option, checked when the server starts against tritonserver 2.51's
    options and the bundle's own (specdec/triton/server_flags.py). It becomes one argument,
    --<flag>=<value> (or --<flag> for an option without a value), never a shell string."""

    flag: Annotated[str, Field(pattern=r"^--[a-z][a-z0-9-]*$")] = Field(description="e.g. --grpc-keepalive-time")
    value: bool | int | float | str | None = Field(None, description='as the option takes it: true, 7200000, "text"')


class ServerOptions(_Strict):
    host: str = "127.0.0.1"
    http_port: Annotated[int, Field(ge=1, le=65535)] = 8000
    grpc_port: Annotated[int, Field(ge=1, le=65535)] = 8001
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = 8002
    openai_port: Annotated[int, Field(ge=0, le=65535)] = Field(
        9000, description="the OpenAI-compatible API (/v1/chat/completions, ...) beside Triton's; 0: none"
    )
    max_inflight: Annotated[int, Field(ge=1)] = 64
    max_queue: Annotated[int, Field(ge=0)] = 256
    batch_wait_ms: Annotated[float, Field(ge=0, le=1000)] = Field(
        5.0,
        description="how long a request's target call may wait, the engine idle, for the other requests in "
        "flight to have theirs ready, so that one forward serves them all (specdec/speculation/lockstep.py); "
        "0: calls go at once",
    )
    max_prompt_bytes: Annotated[int, Field(ge=1)] = 65536
    max_tokens_limit: Annotated[int, Field(ge=1)] = 4096
    max_stop_words: Annotated[int, Field(ge=0)] = 16
    max_stop_word_bytes: Annotated[int, Field(ge=1)] = 256
    max_body_bytes: Annotated[int, Field(ge=1024)] | None = Field(
        None,
        description="the largest request body (HTTP) or message (gRPC) the server's edge reads, and the OpenAI "
        "frontend's; larger ones are refused before they are read. Default (body_limit): room for the largest "
        "prompt and stop words at the worst JSON escaping, plus 64 KiB",
    )
    max_restarts: Annotated[int, Field(ge=0)] = Field(
        3,
        description="`specdec serve` starts tritonserver again when it dies, up to this many times within "
        "restart_window_s (then it exits with 1, for the service manager); 0: exit at once",
    )
    restart_window_s: Annotated[float, Field(gt=0)] = 3600.0
    ready_timeout_s: Annotated[float, Field(gt=0)] = Field(
        300.0,
        description="how long `specdec serve` waits for tritonserver to become ready (models loaded) before it "
        "gives up: a first engine load, or an LLM-API model's first start, can take many minutes",
    )
    tls: TlsOptions | None = Field(None, description="TLS on tritonserver's gRPC endpoint")
    restricted_apis: list[RestrictedApi] = Field(
        [], description="tritonserver APIs that answer only requests with a header key (docs/operations.md)"
    )
    extra_flags: list[ExtraFlag] = Field([], description="other tritonserver options, checked against an allow-list")

    @model_validator(mode="after")
    def _one_group_per_api(self) -> ServerOptions:
        # tritonserver refuses a category in two groups of one protocol (command_line_parser.cc 2062-2067)
        for protocol in ("http", "grpc"):
            seen: dict[str, int] = {}
            for i, group in enumerate(self.restricted_apis):
                if group.protocol != protocol:
                    continue
                for api in group.apis:
                    if api in seen:
                        raise ValueError(f"restricted_apis.{i}: {protocol} api {api!r} is already in "
                                         f"restricted_apis.{seen[api]} (an api may be in one group only)")  # fmt: skip
                    seen[api] = i
        return self

    @model_validator(mode="after")
    def _body_holds_a_prompt(self) -> ServerOptions:
        if self.max_body_bytes is not None and self.max_body_bytes < self.max_prompt_bytes:
            raise ValueError(f"max_body_bytes ({self.max_body_bytes}) is below max_prompt_bytes "
                             f"({self.max_prompt_bytes}): a prompt the server takes would not fit")  # fmt: skip
        return self

    @property
    def body_limit(self) -> int:
        """max_body_bytes, or by default what never refuses a request the checks behind the edge
        accept: JSON spends at most 6 bytes on a byte of text (a control character as \\u00XX), so
        6x the largest prompt and stop words, plus 64 KiB for the other fields."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return 6 * (self.max_prompt_bytes + self.max_stop_words * self.max_stop_word_bytes) + 65536

    @field_validator("host")
    @classmethod
    def _an_address(cls, host: str) -> str:
        if host != "localhost":
            try:
                ipaddress.ip_address(host)
            except ValueError:
                raise ValueError(f"{host!r} is not an IP address (127.0.0.1 keeps the server local)") from None
        return host


class Profile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    description: str = ""
    backend: Literal["pytorch", "tensorrtllm"] = "pytorch"
    target: ModelSource
    draft: ModelSource | None = None
    engine: PytorchEngine = PytorchEngine()
    trtllm: TrtllmOptions | None = Field(None, description="backend tensorrtllm: engine builds and runtime")
    speculation: Speculation = Speculation()
    server: ServerOptions = ServerOptions()
    chat_template: bool = Field(True, description="apply the tokenizer's chat template unless a request says not to")
    build_dir: str | None = Field(None, description="where the build goes; default build/<name> in the checkout")

    @model_validator(mode="after")
    def _draft_needed(self) -> Profile:
        if self.speculation.proposer == "draft_model" and self.draft is None:
            raise ValueError("speculation.proposer is draft_model but the profile has no draft")
        return self

    @model_validator(mode="after")
    def _backend_sections(self) -> Profile:
        if (self.trtllm is not None) != (self.backend == "tensorrtllm"):
            raise ValueError("give the `trtllm` section exactly when backend is tensorrtllm")
        trt = self.trtllm
        if trt is None:
            return self
        if self.engine.device != "cuda":
            raise ValueError("backend tensorrtllm runs on GPUs: set engine.device: cuda")
        if self.target.hf_dir is None or (self.draft is not None and self.draft.hf_dir is None):
            raise ValueError(
                "backend tensorrtllm converts Hugging Face checkpoints: give target.hf_dir (and draft.hf_dir)"
            )
        if (self.draft is not None) != (trt.mode == "draft_target"):
            raise ValueError(
                f"trtllm.mode {trt.mode} "
                + ("needs a `draft` model" if trt.mode == "draft_target" else "takes no separate `draft` model")
                + " (in-engine modes keep their draft weights in their own trtllm section)"
            )
        if trt.external and trt.max_draft_len < self.speculation.max_draft_tokens:
            raise ValueError(
                f"trtllm.max_draft_len ({trt.max_draft_len}) must cover speculation.max_draft_tokens "
                f"({self.speculation.max_draft_tokens}), the largest draft a request may ask"
            )
        if not trt.external and self.speculation.proposer != "none":
            raise ValueError(f"trtllm.mode {trt.mode} drafts inside the engine: set speculation.proposer: none")
        return self

    # --- derived locations -------------------------------------------------------------
    def build_path(self) -> Path:
        if self.build_dir:
            return Path(self.build_dir).expanduser().resolve()
        root = Path(os.environ.get("SPECDEC_BUILD_ROOT", REPO_ROOT / "build"))
        return (root / self.name).resolve()

    def model_dir(self, role: Literal["target", "draft"]) -> Path:
        """Where the role's weights are: a Hugging Face dir used in place, or the build's copy."""
        source = self.target if role == "target" else self.draft
        if source is not None and source.hf_dir and not source.num_layers:
            return Path(source.hf_dir)
        return self.build_path() / "models" / role

    def repository_dir(self) -> Path:
        return self.build_path() / "model_repository"


def _format_validation_error(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid profile"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling and nesting)"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def resolve_relative_paths(data: dict, base: Path) -> dict:
    """hf_dir, build_dir and the n-gram proposer's files may be written relative to the profile's
    own folder."""
    trt = data.get("trtllm") if isinstance(data.get("trtllm"), dict) else {}
    sources = [data.get("target"), data.get("draft")]  # and the in-engine modes' draft weights:
    sources += [trt[mode].get(key) for mode, key in IN_ENGINE_WEIGHTS if isinstance(trt.get(mode), dict)]
    for src in sources:
        if isinstance(src, dict) and isinstance(src.get("hf_dir"), str):
            src["hf_dir"] = str((base / src["hf_dir"]).expanduser().resolve())
    if isinstance(data.get("build_dir"), str):
        data["build_dir"] = str((base / data["build_dir"]).expanduser().resolve())
    spec = data.get("speculation") if isinstance(data.get("speculation"), dict) else {}
    ngram = spec.get("ngram") if isinstance(spec.get("ngram"), dict) else None
    for key in ("guess_head", "phrases"):  # the files the n-gram proposer reads
        if ngram is not None and isinstance(ngram.get(key), str):
            ngram = {**ngram, key: str((base / ngram[key]).expanduser().resolve())}
            spec = data["speculation"] = {**spec, "ngram": ngram}
    server = data.get("server") if isinstance(data.get("server"), dict) else {}
    if isinstance(tls := server.get("tls"), dict):  # the TLS certificates and keys
        paths = {k: str((base / v).expanduser().resolve()) for k in TLS_FILES if isinstance(v := tls.get(k), str)}
        data["server"] = {**server, "tls": {**tls, **paths}}
    return data


def parse_profile(data: object, source: str = "<profile>", base: Path | None = None) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a YAML mapping, got {type(data).__name__}")
    if base is not None:
        data = resolve_relative_paths(dict(data), base)
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(_format_validation_error(source, err)) from None


def load_profile(path: str | os.PathLike | None = None) -> Profile:
    """Read and validate a profile; None means the embedded default."""
    file = Path(path) if path is not None else DEFAULT_PROFILE
    if not file.is_file():
        raise ProfileError(f"{file}: no such profile file")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ProfileError(f"{file}: not valid YAML: {err}") from None
    return parse_profile(data, str(file), base=file.resolve().parent)
