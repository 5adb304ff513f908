// The Python module of the CPU kernels (built by prefixcache/model/kernels/build.py).
// Every kernel runs without the GIL (like torch's own ops): they touch no Python object,
// and a server's HTTP thread keeps serving while an engine step is inside one (a prefill
// attention call lasts tens of milliseconds).
#include <torch/extension.h>

void paged_decode(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                  torch::Tensor page_table, torch::Tensor ctx_lens, torch::Tensor out,
                  int64_t window, double scale);
void paged_prefill(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                   torch::Tensor page_table, int64_t first, torch::Tensor out, double scale);
void rope_write(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_heads,
                torch::Tensor slots, torch::Tensor k_pool, torch::Tensor v_pool);
void silu_mul(torch::Tensor gate_up, torch::Tensor out);
int64_t fused_vector_width();
void rms_apply(torch::Tensor x, torch::Tensor r, torch::Tensor weight, torch::Tensor out);
void small_linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias,
                  c10::optional<torch::Tensor> residual, torch::Tensor out);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using nogil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("paged_decode", &paged_decode, "paged decode attention, KV read in place", nogil());
  m.def("paged_prefill", &paged_prefill, "paged causal prefill attention, KV read in place",
        nogil());
  m.def("rope_write", &rope_write, "RoPE of q and k in place and the KV write (exact)",
        nogil());
  m.def("silu_mul", &silu_mul, "silu(gate) * up (exact)", nogil());
  m.def("fused_vector_width", &fused_vector_width, "lanes of silu_mul's vector exp", nogil());
  m.def("rms_apply", &rms_apply, "(x * r) * weight (exact)", nogil());
  m.def("small_linear", &small_linear, "x @ weight.T (+ bias) (+ residual) for 1-8 rows",
        nogil());
}
