"""The weight-streaming linear kernel of 1-8 rows against float64 matrix products (tails
in K and N, bias, residual, strided rows); each row's bits independent of the other rows;
its refusals; and ``PackedLinear`` routing decode-sized steps to it."""
from __future__ import annotations

import pytest
import torch

from prefixcache.model.cpu.kernels import small_gemm
from prefixcache.model.cpu.packed_linear import PackedLinear
from tests.helpers.kernels import built_or_skip


@pytest.fixture(scope="module")
def built():
    return built_or_skip(small_gemm, "small GEMM")


@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize("n,k", [(50, 64), (1027, 37), (6, 513), (3, 16), (577, 1536)])
@pytest.mark.parametrize("extras", ["none", "bias", "residual", "both"])
def test_matches_float64_matmul(built, rows, n, k, extras):
    g = torch.Generator().manual_seed(rows * 7919 + n + k)
    x = torch.randn(rows, 2 * k, generator=g)[:, :k]  # strided rows
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if extras in ("bias", "both") else None
    r = torch.randn(rows, n, generator=g) if extras in ("residual", "both") else None
    got = built.linear(x, w, b, r)
    want = x.double() @ w.double().T
    if b is not None:
        want += b.double()
    if r is not None:
        want += r.double()
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=2e-5 * k ** 0.5, rtol=1e-5)


def test_a_rows_bits_do_not_depend_on_the_other_rows(built):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4099, 576, generator=g)
    x = torch.randn(8, 576, generator=g)
    alone = torch.cat([built.linear(x[i:i + 1], w) for i in range(8)])
    for m in range(2, 9):
        assert torch.equal(built.linear(x[:m], w), alone[:m])


def test_refusals(built):
    w = torch.randn(5, 8)
    with pytest.raises(RuntimeError, match="1 to 8 rows"):
        built.linear(torch.randn(9, 8), w)
    with pytest.raises(RuntimeError, match="shapes"):
        built.linear(torch.randn(2, 7), w)
    with pytest.raises(RuntimeError, match="bias"):
        built.linear(torch.randn(2, 8), w, torch.randn(4))
    with pytest.raises(RuntimeError, match="residual"):
        built.linear(torch.randn(2, 8), w, None, torch.randn(3, 5))
    with pytest.raises(RuntimeError, match="weight"):
        built.linear(torch.randn(2, 8), torch.randn(8, 5).T)
    with pytest.raises(RuntimeError, match="x, out"):
        built.linear(torch.randn(2, 8).double(), w)


def test_packed_linear_routes_decode_rows_to_it(built, monkeypatch):
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(300, 64, generator=g), torch.randn(300, generator=g)
    lin = PackedLinear(w, b)
    calls = []
    real = small_gemm.linear
    monkeypatch.setattr(small_gemm, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for rows in (1, 4, 8, 9, 16):
        x = torch.randn(rows, 64, generator=g)
        r = torch.randn(rows, 300, generator=g)
        torch.testing.assert_close(lin(x, small_gemm=True), x @ w.T + b, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(lin(x, residual=r, small_gemm=True), r + (x @ w.T + b),
                                   atol=1e-4, rtol=1e-5)
    assert calls == [1, 1, 4, 4, 8, 8]  # 9 and 16 rows: oneDNN's packed kernel
    lin(torch.randn(4, 64))  # not asked for (the backend's switch off)
    assert calls == [1, 1, 4, 4, 8, 8]
