"""The package's layers (specdec/__init__.py, docs/design.md): each module imports only from its
own layer and the layers below it, so there is no import cycle between layers; the engine is
self-contained; no module imports a private name of another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specdec

PACKAGE = Path(specdec.__file__).parent
LEAF = ("config", "contract", "tokenizer", "texts", "progress")
LAYERS = {
    **dict.fromkeys(LEAF, 0),
    "engine": 1,
    "speculation": 2,
    "build": 3,
    "triton": 4,
    "client": 5,
    "openai": 6,
    "cli": 7,
}


def layer(module: str) -> int:
    """specdec.engine.model -> 1; specdec.config -> 0."""
    return LAYERS[module.split(".")[1]]


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def is_module(dotted: str) -> bool:
    path = PACKAGE.parent / dotted.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(specdec module, the names taken from it) for each import of a specdec module, at any depth."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub, []) if is_module(sub) else (node.module, [alias.name]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("specdec.")]
    return out


def name_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers(path):
    if path.parent == PACKAGE and path.stem == "__init__":
        return
    mine = layer(name_of(path))
    for module, _ in imports(path):
        assert layer(module) <= mine, f"{name_of(path)} (layer {mine}) imports {module} (layer {layer(module)})"
        if mine == 0:
            assert module.split(".")[1] in LEAF and layer(module) == 0


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_crosses_modules(path):
    for module, names in imports(path):
        assert not [n for n in names if n.startswith("_")], f"{name_of(path)} imports private names of {module}"


def test_the_engine_imports_only_itself_and_leaf_modules():
    for path in (PACKAGE / "engine").rglob("*.py"):
        for module, _ in imports(path):
            assert module.startswith("specdec.engine") or module.split(".")[1] in LEAF, (path.name, module)
