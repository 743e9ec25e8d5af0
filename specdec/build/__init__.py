"""Builds: weights for the PyTorch engine, TensorRT-LLM engines, and the rendered repository."""

from __future__ import annotations

from pathlib import Path

from specdec.config import Profile


def build(profile: Profile) -> Path:
    """Everything `specdec serve` needs for this profile; returns the model repository."""
    from specdec.build.cpu import build_models
    from specdec.build.render import render_repository

    build_models(profile)
    return render_repository(profile)
