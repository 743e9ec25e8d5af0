"""Builds: weights for the PyTorch engine, TensorRT-LLM engines, and the rendered repository."""

from __future__ import annotations

from pathlib import Path

from specdec.config import Profile, ProfileError


def build(profile: Profile, dry_run: bool = False, render_only: bool = False, output_dir: Path | None = None) -> Path:
    """Everything `specdec serve` needs for this profile; returns the model repository. With
    dry_run, print what would run (for TensorRT-LLM: the exact commands) and write nothing. With
    render_only, write only the model repository, exactly as a build does (to output_dir, else
    the build's), converting and building nothing: what will be served, to read and diff."""
    from specdec.build.repository import render_repository

    if render_only:
        return render_repository(profile, output_dir)

    ngram = profile.speculation.ngram
    for key, path, command in (
        ("guess_head", ngram.guess_head, "train one with `specdec train-guess-head`"),
        ("phrases", ngram.phrases, "write one with `specdec train-guess-head`"),
    ):
        if not dry_run and path is not None and not Path(path).is_file():
            raise ProfileError(f"speculation.ngram.{key}: no such file {path} ({command}, or leave the key out)")
    if profile.backend == "tensorrtllm":
        from specdec.build.trtllm import build_engines

        build_engines(profile, dry_run=dry_run)
    elif dry_run:
        sources = {"target": profile.target, "draft": profile.draft}
        for role, source in sources.items():
            if source is not None:
                print(f"# {role} weights: {profile.model_dir(role)} (from {source.hf_dir or source.gguf_file})")
    else:
        from specdec.build.cpu import build_models

        build_models(profile)
    if dry_run:
        print(f"# render the model repository into {profile.repository_dir()}")
        return profile.repository_dir()
    return render_repository(profile)
