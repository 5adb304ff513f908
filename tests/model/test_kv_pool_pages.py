"""KVPool.export_pages / import_pages: the one way page contents leave and enter the pool."""
from __future__ import annotations

import pytest
import torch

from prefixcache.model.kv_pool import KVPool


def pool(dtype=torch.float32) -> KVPool:
    p = KVPool(num_layers=3, num_pages=6, block_size=4, num_kv_heads=2, head_dim=5,
               dtype=dtype, device="cpu")
    g = torch.Generator().manual_seed(0)
    for t in p.k + p.v:
        t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    return p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_export_import_round_trip_through_bytes(dtype):
    src, dst = pool(dtype), KVPool(3, 6, 4, 2, 5, dtype, "cpu")
    out = src.export_pages([4, 1])
    assert out.shape == (2, 2, 3, 4, 2, 5) == (2, *src.page_shape) and out.is_contiguous()
    assert torch.equal(out[0, 0, 2], src.k[2][4]) and torch.equal(out[1, 1, 0], src.v[0][1])
    raw = out.view(torch.uint8).numpy().tobytes()
    back = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(out.shape)
    dst.import_pages([0, 5], back)
    for layer in range(3):
        assert torch.equal(dst.k[layer][0], src.k[layer][4])
        assert torch.equal(dst.v[layer][5], src.v[layer][1])
        assert not dst.k[layer][1].any()  # other pages untouched


def test_bad_arguments_name_the_parameter():
    p = pool()
    with pytest.raises(ValueError, match="page_ids"):
        p.export_pages([])
    with pytest.raises(ValueError, match="page_ids"):
        p.export_pages([6])
    with pytest.raises(ValueError, match="data"):
        p.import_pages([0], torch.zeros(2, *p.page_shape))
    with pytest.raises(ValueError, match="data"):
        p.import_pages([0], torch.zeros(1, *p.page_shape, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_pages_copies_every_layer_and_nothing_else(dtype):
    p = pool(dtype)
    before = [t.clone() for t in p.k + p.v]
    p.copy_pages([1, 4], [3, 0])
    for layer in range(3):
        for t, old in ((p.k[layer], before[layer]), (p.v[layer], before[3 + layer])):
            assert torch.equal(t[3], old[1]) and torch.equal(t[0], old[4])
            for page in (1, 2, 4, 5):
                assert torch.equal(t[page], old[page])


def test_copy_pages_refuses_bad_pairs():
    p = pool()
    with pytest.raises(ValueError, match="copy_pages"):
        p.copy_pages([1, 2], [3])
    with pytest.raises(ValueError, match="copy_pages"):
        p.copy_pages([1, 2], [2, 3])  # overlapping: the result would depend on the order
    with pytest.raises(ValueError, match="page_ids"):
        p.copy_pages([1], [6])
