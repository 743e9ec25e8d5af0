"""The key and the tags internal models take calls under (specdec/triton/internal.py)."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from specdec.contract import stop_words_to_list
from specdec.triton.internal import (
    CHECKED_INPUTS,
    KEY_ENV,
    KEY_PARAMETER,
    TAG,
    InternalAccess,
    NoKey,
    access_path,
    carries_key,
    checked_request_tagged,
    checked_tag,
    key_from_environment,
    new_key,
    read_access_file,
    sequence_tag,
    tag_matches,
    write_access_file,
)

KEY = new_key().encode()


def checked(ids=(5, 6, 7), max_tokens=8, end_id=2, stop=((9,),)) -> dict[str, np.ndarray]:
    """spec_decode's inputs as preprocessing hands them on (no batch dimension)."""
    return {
        "input_ids": np.array(ids, dtype=np.int32),
        "input_lengths": np.array([len(ids)], dtype=np.int32),
        "max_tokens": np.array([max_tokens], dtype=np.int32),
        "end_id": np.array([end_id], dtype=np.int32),
        "stop_words_list": stop_words_to_list([list(w) for w in stop]),
    }


def test_a_fresh_key_each_time_and_read_from_the_environment():
    assert new_key() != new_key() and len(new_key()) == 64
    assert key_from_environment({KEY_ENV: "ab" * 32}) == b"ab" * 32
    for environ in ({}, {KEY_ENV: "short"}):
        with pytest.raises(NoKey, match=KEY_ENV):
            key_from_environment(environ)


def test_only_the_key_itself_as_a_string_parameter_is_carried():
    key = KEY.decode()
    assert carries_key(json.dumps({KEY_PARAMETER: key, "other": 1}), KEY)
    for parameters in ("{}", "", "[]", "not json", json.dumps({KEY_PARAMETER: new_key()}),
                       json.dumps({KEY_PARAMETER: key[:-1]}), json.dumps({"x": key}),
                       json.dumps([KEY_PARAMETER, key]), json.dumps({KEY_PARAMETER: 7})):  # fmt: skip
        assert not carries_key(parameters, KEY), parameters


def test_the_checked_tag_covers_exactly_what_preprocessing_checked():
    inputs = checked()
    tagged = {**inputs, TAG: checked_tag(KEY, inputs), "temperature": np.array([0.7], dtype=np.float32)}
    assert checked_request_tagged(KEY, tagged)  # the client's own inputs beside it do not matter
    for name, changed in (("input_ids", checked(ids=(5, 6, 8))), ("max_tokens", checked(max_tokens=9)),
                          ("end_id", checked(end_id=-1)), ("stop_words_list", checked(stop=()))):  # fmt: skip
        assert not checked_request_tagged(KEY, {**tagged, name: changed[name]}), name
    # the same values in another dtype or shape are other tensors
    assert not checked_request_tagged(KEY, {**tagged, "input_ids": inputs["input_ids"].astype(np.int64)})
    assert not checked_request_tagged(KEY, {**tagged, "input_ids": inputs["input_ids"][None]})
    for name in CHECKED_INPUTS:
        assert not checked_request_tagged(KEY, {k: v for k, v in tagged.items() if k != name}), name
    assert not checked_request_tagged(KEY, inputs)  # no tag
    assert not checked_request_tagged(new_key().encode(), tagged)  # another start's key


def test_a_tag_is_good_for_its_purpose_only():
    inputs = checked()
    sequence = sequence_tag(KEY, 12345)
    assert tag_matches(sequence_tag(KEY, 12345), sequence)
    assert not tag_matches(sequence_tag(KEY, 12346), sequence)
    assert not checked_request_tagged(KEY, {**inputs, TAG: sequence})
    assert not tag_matches(sequence, checked_tag(KEY, inputs))


def test_a_tag_of_the_wrong_kind_never_matches():
    expected = sequence_tag(KEY, 1)
    assert not tag_matches(expected, None)
    assert not tag_matches(expected, expected[:16])
    assert not tag_matches(expected, expected.astype(np.int32))
    assert tag_matches(expected, expected[None])  # as a request carries it, [1, 32]


def test_the_access_file_is_the_users_alone(tmp_path):
    path = access_path(tmp_path / "build", 8001)
    access = InternalAccess("127.0.0.1:1", "127.0.0.1:2", new_key())
    write_access_file(path, access)
    assert read_access_file(path) == access
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    write_access_file(path, replaced := InternalAccess("127.0.0.1:3", "127.0.0.1:4", new_key()))  # a restart
    assert read_access_file(path) == replaced
    assert read_access_file(access_path(tmp_path / "build", 9)) is None
