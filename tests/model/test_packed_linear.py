"""PackedLinear: the prepacked oneDNN head equals F.linear within float32 rounding."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixcache.model.packed_linear import PackedLinear


def test_matches_linear_for_every_row_count_and_repacks_after_a_write():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1000, 64, generator=g)
    head = PackedLinear(w)
    assert head.enabled == torch.backends.mkldnn.is_available()
    for n in (1, 2, 3, 8, 17, 64):
        x = torch.randn(n, 64, generator=g)
        got = head(x)
        assert got.shape == (n, 1000) and got.dtype == torch.float32
        torch.testing.assert_close(got, F.linear(x, w), atol=1e-4, rtol=1e-5)
    with torch.inference_mode():
        w.mul_(2.0)  # a new weight (version bump): the packed copy is remade
        x = torch.randn(4, 64, generator=g)
        torch.testing.assert_close(head(x), F.linear(x, w), atol=2e-4, rtol=1e-5)


def test_one_row_is_exactly_f_linear():
    w = torch.randn(300, 32)
    x = torch.randn(1, 32)
    assert torch.equal(PackedLinear(w)(x), F.linear(x, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_dtypes_use_f_linear(dtype):
    w = torch.randn(50, 16).to(dtype)
    head = PackedLinear(w)
    assert not head.enabled
    x = torch.randn(4, 16).to(dtype)
    assert torch.equal(head(x), F.linear(x, w))
