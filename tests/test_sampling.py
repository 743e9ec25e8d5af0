from __future__ import annotations

import math

import pytest
import torch

from specdec import sampling
from specdec.sampling import SamplingError, SamplingParams


def test_temperature_softmax():
    logits = torch.tensor([1.0, 2.0, 3.0])
    p = sampling.probs_row(logits, SamplingParams(temperature=2.0))
    torch.testing.assert_close(p, torch.softmax(logits / 2, -1))


def test_top_k_keeps_exactly_the_k_most_likely():
    logits = torch.tensor([0.1, 3.0, 2.0, -1.0, 2.5])
    p = sampling.probs_row(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(torch.nonzero(p).flatten().tolist()) == {1, 4}
    assert math.isclose(p.sum().item(), 1.0, rel_tol=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p = sampling.probs_row(probs.log(), SamplingParams(temperature=1.0, top_p=0.75))
    assert torch.nonzero(p).flatten().tolist() == [0, 1]  # 0.5 < 0.75 <= 0.8
    torch.testing.assert_close(p[:2], torch.tensor([0.625, 0.375]))
    p = sampling.probs_row(probs.log(), SamplingParams(temperature=1.0, top_p=0.01))
    assert torch.nonzero(p).flatten().tolist() == [0]  # always at least the most likely token


def test_noise_depends_only_on_seed_and_position():
    a = sampling.exponential_noise(42, [10, 11, 12], 50, torch.device("cpu"))
    b = sampling.exponential_noise(42, [12], 50, torch.device("cpu"))
    c = sampling.exponential_noise(43, [12], 50, torch.device("cpu"))
    assert torch.equal(a[2], b[0]) and not torch.equal(b, c)
    u1 = sampling.uniform_noise(42, [10, 11], torch.device("cpu"))
    u2 = sampling.uniform_noise(42, [11], torch.device("cpu"))
    assert u1[1] == u2[0]


def test_probs_of_a_row_does_not_depend_on_the_other_rows():
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0)) * 3
    params = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)
    together = sampling.probs(logits, params)
    for i in range(6):
        assert torch.equal(together[i], sampling.probs(logits[i : i + 1], params)[0])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(temperature=float("inf")), "temperature"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_p=float("nan")), "top_p"),
        (SamplingParams(seed=-1), "seed"),
    ],
)
def test_invalid_parameters_name_their_field(params, field):
    with pytest.raises(SamplingError) as err:
        params.validate()
    assert err.value.field == field and str(err.value).startswith(field)


def test_derived_seed_differs_and_is_stable():
    assert sampling.derive_seed(5, 1) == sampling.derive_seed(5, 1) != sampling.derive_seed(5, 2)
