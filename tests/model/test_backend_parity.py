"""The compute backends against each other on the same steps: plain torch (``torch``, the
CUDA path), the CPU backend without its C++ kernels (``cpu``) and with them
(``cpu-kernels``) give the same logits within float32 rounding and the same greedy tokens,
and write the same KV; each matches transformers. Models are built through the loader's
``make_backend``, as ``EngineConfig.compute_backend`` chooses them."""
from __future__ import annotations

import pytest
import torch

from prefixcache.model.backend import ComputeBackend, TorchBackend
from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.weights import load_hf_weights
from tests.helpers.hf_models import hf_logits, make_hf_model
from tests.helpers.paged import PagedRunner, Seq, cpu_model, paged_copy

BACKENDS = ("torch", "cpu", "cpu-kernels")


def _steps(m) -> tuple[torch.Tensor, PagedRunner, list[int], list[int]]:
    """Cold prefill, chunked prefill, a chunk after a cached prefix (a fork; long enough
    for the prefix split), and batched decode of three sequences; every logit row."""
    g = torch.Generator().manual_seed(21)
    prompt = torch.randint(0, 256, (300,), generator=g).tolist()
    tail = torch.randint(0, 256, (260,), generator=g).tolist()
    runner = PagedRunner(m, num_pages=96)
    a, b = Seq(), Seq()
    out = [runner.prefill(a, prompt, all_logits=True),
           runner.prefill(b, prompt[:100], chunk=33, all_logits=True)]
    fork = runner.fork(a, 288)
    out.append(runner.step([(fork, tail)], all_logits=True)[0])
    for t in range(3):
        out += [x[None] for x in runner.step([(a, [t + 7]), (b, [t + 9]), (fork, [t + 11])])]
    return torch.cat(out), runner, prompt, tail


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral_window"])
def test_backends_agree_on_the_same_steps(kind):
    hf = make_hf_model(kind)
    logits, kv, names = {}, {}, {}
    for name in BACKENDS:
        m = cpu_model(paged_copy(hf).config, backend=name)
        load_hf_weights(m, hf.state_dict().__getitem__)
        m.prepack()
        names[name] = m.backend.name
        logits[name], runner, prompt, tail = _steps(m)
        kv[name] = (runner.kv.k, runner.kv.v)
    assert names["torch"] == "torch" and names["cpu"] == "cpu"
    # the same steps, token for token: 300 + 100 + 260 prefill rows and 9 decode rows
    assert all(x.shape == (300 + 100 + 260 + 9, hf.config.vocab_size) for x in logits.values())
    for name in BACKENDS[1:]:
        torch.testing.assert_close(logits[name], logits["torch"], atol=1e-4, rtol=1e-4)
        assert torch.equal(logits[name].argmax(-1), logits["torch"].argmax(-1))
        for a, b in zip([*kv[name][0], *kv[name][1]], [*kv["torch"][0], *kv["torch"][1]]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    want = hf_logits(hf, prompt)
    torch.testing.assert_close(logits["torch"][:300], want, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(logits["torch"][400:660], hf_logits(hf, prompt[:288] + tail)[288:],
                               atol=2e-4, rtol=1e-4)


def test_the_cpu_backend_is_bit_identical_with_and_without_its_fused_ops_and_split():
    """Switches whose ops return torch's bits (fused ops) leave every bit as it was; the
    prefix split agrees with the masked call within rounding."""
    m = paged_copy(make_hf_model("llama"))
    base = m.backend
    assert isinstance(base, CpuKernelBackend)
    m.set_backend(base.replace(fused_ops=False))
    want = _steps(m)[0]
    m.set_backend(base.replace(fused_ops=True))
    assert torch.equal(_steps(m)[0], want)
    m.set_backend(base.replace(split_prefix=False, prefill_kernel=False))
    masked = _steps(m)[0]
    m.set_backend(base.replace(split_prefix=True, prefill_kernel=False))
    torch.testing.assert_close(_steps(m)[0], masked, atol=1e-5, rtol=1e-5)


def test_set_backend_refuses_a_backend_with_other_linear_handles():
    m = paged_copy(make_hf_model("llama"))
    before = m.backend
    with pytest.raises(ValueError, match="backend: .* prepares linears otherwise"):
        m.set_backend(TorchBackend())
    assert m.backend is before and all(layer.backend is before for layer in m.decoder_layers)
    with pytest.raises(ValueError, match="unknown CpuKernelBackend switches"):
        before.replace(turbo=True)


def test_a_new_backend_is_one_class():
    """A backend overriding only ``linear`` (here counting calls) runs every linear of the
    model through it: the model code has no other door."""
    class Counting(TorchBackend):
        name = "counting"

        def __init__(self):
            self.rows: list[int] = []

        def linear(self, x, prepared, residual=None):
            self.rows.append(x.shape[0])
            return super().linear(x, prepared, residual)

    hf = make_hf_model("llama")
    backend = Counting()
    assert isinstance(backend, ComputeBackend)
    from prefixcache.model.llama import PagedLlama

    m = PagedLlama(paged_copy(hf).config, backend=backend)
    load_hf_weights(m, hf.state_dict().__getitem__)
    runner = PagedRunner(m, num_pages=8)
    got = runner.prefill(Seq(), list(range(3, 23)), all_logits=True)
    torch.testing.assert_close(got, hf_logits(hf, list(range(3, 23))), atol=2e-4, rtol=1e-4)
    layers = m.config.num_hidden_layers
    assert backend.rows == [20] * (4 * layers) + [20]  # 4 linears a layer, then lm_head
