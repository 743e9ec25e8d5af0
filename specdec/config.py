"""Deployment profiles: the YAML schema, its validation, and where a profile's build goes.

A profile is data only: it names files, packages and numbers, never code to import
(model sources are located on disk, not executed). Every error names the key path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_batch_size: Annotated[int, Field(ge=1, le=256)] = 16
    max_seq_len: Annotated[int, Field(ge=16, le=131072)] = 2048
    kv_slots: Annotated[int, Field(ge=1, le=1024)] = 16
    threads: Annotated[int, Field(ge=1)] | None = Field(None, description="CPU threads; default: all cores")
    max_queue_delay_us: Annotated[int, Field(ge=0, le=1_000_000)] = 1000
    instances: Annotated[int, Field(ge=1, le=8)] = 1


class NgramOptions(_Strict):
    min_n: Annotated[int, Field(ge=1, le=16)] = 1
    max_n: Annotated[int, Field(ge=1, le=16)] = 4

    @model_validator(mode="after")
    def _order(self) -> NgramOptions:
        if self.min_n > self.max_n:
            raise ValueError(f"min_n ({self.min_n}) must be <= max_n ({self.max_n})")
        return self


class AdaptiveOptions(_Strict):
    """How the draft length follows acceptance and load (see specdec/controller.py)."""

    enabled: bool = True
    ema_alpha: Annotated[float, Field(gt=0, le=1)] = 0.3
    min_draft_tokens: Annotated[int, Field(ge=0)] = 0


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


class ServerOptions(_Strict):
    host: str = "127.0.0.1"
    http_port: Annotated[int, Field(ge=1, le=65535)] = 8000
    grpc_port: Annotated[int, Field(ge=1, le=65535)] = 8001
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = 8002
    max_inflight: Annotated[int, Field(ge=1)] = 64
    max_queue: Annotated[int, Field(ge=0)] = 256
    max_prompt_bytes: Annotated[int, Field(ge=1)] = 65536
    max_tokens_limit: Annotated[int, Field(ge=1)] = 4096


class Profile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    description: str = ""
    backend: Literal["pytorch"] = "pytorch"
    target: ModelSource
    draft: ModelSource | None = None
    engine: PytorchEngine = PytorchEngine()
    speculation: Speculation = Speculation()
    server: ServerOptions = ServerOptions()
    chat_template: bool = Field(True, description="apply the tokenizer's chat template unless a request says not to")
    build_dir: str | None = Field(None, description="where the build goes; default build/<name> in the checkout")

    @model_validator(mode="after")
    def _draft_needed(self) -> Profile:
        if self.speculation.proposer == "draft_model" and self.draft is None:
            raise ValueError("speculation.proposer is draft_model but the profile has no draft")
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
    """hf_dir and build_dir may be written relative to the profile's own folder."""
    for role in ("target", "draft"):
        src = data.get(role)
        if isinstance(src, dict) and isinstance(src.get("hf_dir"), str):
            src["hf_dir"] = str((base / src["hf_dir"]).expanduser().resolve())
    if isinstance(data.get("build_dir"), str):
        data["build_dir"] = str((base / data["build_dir"]).expanduser().resolve())
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
