// The parts of ATen houchu's kernels use (tensors, AT_DISPATCH, at::parallel_for, at::empty,
// zeros, empty_like), instead of <ATen/ATen.h>, which declares every operator: it halves
// the torch headers' share of each translation unit's build (2.6 s instead of 4.6 s).
#pragma once
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include <cstdint>

namespace houchu_cpu {

// at::parallel_for(begin, end, grain, f), or one call f(begin, end) in the standalone kernel
// checks (tests/unit/native/*.cpp, built with -DHOUCHU_NO_LIBTORCH), which include these
// headers but link no libtorch (the aarch64 one is cross-compiled and run under qemu).
template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#ifdef HOUCHU_NO_LIBTORCH
  (void)grain;
  if (begin < end) f(begin, end);
#else
  at::parallel_for(begin, end, grain, f);
#endif
}

}  // namespace houchu_cpu
