// The Python module of the CPU kernels (built by prefixcache/model/kernels/build.py).
#include <torch/extension.h>

void paged_decode(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                  torch::Tensor page_table, torch::Tensor ctx_lens, torch::Tensor out,
                  int64_t window, double scale);
void paged_prefill(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                   torch::Tensor page_table, int64_t first, torch::Tensor out, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention, KV read in place");
  m.def("paged_prefill", &paged_prefill, "paged causal prefill attention, KV read in place");
}
