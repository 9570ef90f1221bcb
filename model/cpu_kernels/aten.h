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
