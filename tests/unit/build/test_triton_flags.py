"""The record of tritonserver 2.51's command line against the bundled binary itself: every option
its --help lists is recorded with its kind, and nothing else; its restricted-API categories are the
record's and the profile schema's."""

from __future__ import annotations

import re
import subprocess
from typing import get_args

import pytest

from specdec.build.triton_flags import FLAGS, GRPC_HEADER_PREFIX, RESTRICTED_CATEGORIES, RESTRICTED_FLAGS
from specdec.config import RestrictedCategory
from specdec.triton.serve import TritonServer, find_triton


@pytest.fixture(scope="module")
def usage(tmp_path_factory) -> str:
    """The bundled tritonserver's --help (it prints its usage and exits non-zero)."""
    from specdec.config import load_profile

    install = find_triton(tmp_path_factory.mktemp("triton"))
    env = TritonServer(load_profile()).environment(install)
    run = subprocess.run([str(install.binary), "--help"], env=env, capture_output=True, text=True, timeout=60)
    text = run.stdout + run.stderr
    assert "Usage: tritonserver [options]" in text, text[-2000:]
    return text


def test_every_option_of_the_binary_is_recorded_and_no_other(usage):
    listed = re.findall(r"^  --([a-z0-9-]+)", usage, flags=re.M)
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(FLAGS)


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_each_options_value_is_what_its_usage_says(usage, name):
    line = re.search(rf"^  --{re.escape(name)}( <(.*)>)?$", usage, flags=re.M)
    assert line is not None
    kind = FLAGS[name].kind
    shown = line.group(2)
    if name == "metrics-interval-ms":  # shown as <float> but parsed as an integer (the record's note)
        assert shown == "float" and kind == "int"
    elif kind == "none":
        assert shown is None
    elif kind in ("bool", "int", "string"):
        assert shown == {"bool": "boolean", "int": "integer", "string": "string"}[kind]
    elif kind == "float":
        assert shown == "float"
    elif kind == "choice":  # a string the parser compares with its choices
        assert shown == "string"
        described = usage[line.end() : usage.find("\n  --", line.end())]
        assert all(f'"{choice}"' in described or choice in described for choice in FLAGS[name].choices)
    else:  # a compound value: its usage shows its parts
        assert shown is not None and shown != "string"


def test_the_restricted_categories_are_the_binarys_and_the_schemas(usage):
    for flag in RESTRICTED_FLAGS.values():
        described = usage[usage.index(f"--{flag} ") :]
        allowed = re.search(r"Allowed (?:APIs|protocols): ([a-z,\s-]+)", described)
        assert allowed is not None
        assert tuple(c.strip() for c in allowed.group(1).split(",")) == RESTRICTED_CATEGORIES
    assert get_args(RestrictedCategory) == RESTRICTED_CATEGORIES
    assert GRPC_HEADER_PREFIX.endswith("-")
