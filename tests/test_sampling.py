from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

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


def test_uniforms_depend_only_on_seed_and_position():
    a = sampling.sample_uniforms(42, [10, 11, 12], torch.device("cpu"))
    b = sampling.sample_uniforms(42, [12], torch.device("cpu"))
    c = sampling.sample_uniforms(43, [12], torch.device("cpu"))
    assert a.dtype == torch.float64 and a[2] == b[0] and b[0] != c[0]
    u1 = sampling.uniform_noise(42, [10, 11], torch.device("cpu"))
    u2 = sampling.uniform_noise(42, [11], torch.device("cpu"))
    assert u1[1] == u2[0]
    assert sampling.sample_uniforms(42, [11], torch.device("cpu"))[0] != u2[0]  # streams apart


def test_sample_draws_each_token_with_its_probability():
    """Chi-square over 20000 draws, zeros in p never drawn, an unnormalised row the same."""
    p = torch.tensor([0.0, 0.1, 0.0, 0.25, 0.6, 0.05, 0.0])
    u = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    drawn = sampling.sample(p.expand(len(u), -1), u)
    counts = np.bincount(drawn.numpy(), minlength=len(p))
    assert counts[p.numpy() == 0].sum() == 0
    support = p.numpy() > 0
    assert chisquare(counts[support], p.numpy()[support] * len(u)).pvalue > 1e-3
    assert torch.equal(sampling.sample(3 * p.expand(len(u), -1), u), drawn)
    assert sampling.sample(torch.zeros(2, 5), torch.tensor([0.0, 0.99], dtype=torch.float64)).tolist() == [4, 4]


def _top_p_by_full_sort(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition: sort every token, keep them until the kept mass reaches top_p."""
    sorted_p, order = torch.sort(p, descending=True)
    drop_sorted = torch.cumsum(sorted_p, dim=-1) - sorted_p >= top_p
    drop_sorted[0] = False
    kept = p.masked_fill(torch.empty_like(drop_sorted).scatter_(0, order, drop_sorted), 0.0)
    return kept / kept.sum()


def _same_cut(a: torch.Tensor, b: torch.Tensor, p: torch.Tensor) -> bool:
    """The same kept probabilities, up to which of equally likely tokens a cut through them keeps."""
    kept_a, kept_b = a > 0, b > 0
    return torch.equal(torch.sort(a[kept_a]).values, torch.sort(b[kept_b]).values) and bool(
        p[kept_a].min() >= torch.cat([p[~kept_a], torch.zeros(1)]).max()
    )


# the cut within the first 256 tokens, the first 4096 (scale 3, top_p 0.9) and the whole row
@pytest.mark.parametrize("scale", [8.0, 3.0, 0.05])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_top_p_cuts_where_a_full_sort_would(scale, top_p):
    logits = torch.randn(5, 49152, generator=torch.Generator().manual_seed(1)) * scale
    for row in logits:
        p = torch.softmax(row, dim=-1)
        assert _same_cut(sampling._top_p(p, top_p), _top_p_by_full_sort(p, top_p), p)


def test_top_p_cut_at_the_end_of_a_prefix():
    """The 256th token brings the kept mass to top_p exactly: it is kept, the 257th is not."""
    p = torch.cat([torch.full((256,), 1 / 512), torch.full((512,), 1 / 1024)])
    kept = sampling._top_p(p, 0.5)
    assert torch.count_nonzero(kept) == 256 and torch.equal(kept, _top_p_by_full_sort(p, 0.5))


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
