// Greedy sampling's argmax over float32 logits rows (the operator; argmax.h has the row
// kernel and its semantics: torch.argmax's, the first index of the maximum, a NaN counting
// as the maximum).
#include "aten.h"
#include <ATen/Parallel.h>
#include "library.h"

#include <cstdint>

#include "argmax.h"

namespace houchu_cpu {
namespace {

// x: [R, V] float32 with contiguous rows, V >= 1. Returns [R] int64, as x.argmax(-1).
// Raises c10::Error (RuntimeError) on another shape or dtype.
at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) >= 1 && (x.stride(1) == 1 || x.size(1) == 1) &&
                  x.scalar_type() == at::kFloat,
              "argmax_rows: x must be a float32 [R, V] with V >= 1 and contiguous rows");
  const int64_t rows = x.size(0), n = x.size(1), ld = x.stride(0);
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* p = x.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) o[r] = argmax_row(p + r * ld, n);
  });
  return out;
}

}  // namespace
}  // namespace houchu_cpu

HOUCHU_FRAGMENT(m) { m.def("argmax_rows(Tensor x) -> Tensor"); }

HOUCHU_IMPL(m) { m.impl("argmax_rows", &houchu_cpu::argmax_rows); }
