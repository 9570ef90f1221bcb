// The operator library of one ISA level's build: houchu_cpu_<level> (the build passes
// -DHOUCHU_LIB=houchu_cpu_<level>), so every level's build can be loaded into one process
// side by side (cpu_kernels/__init__.py; the tests run each level).
#pragma once
#include <torch/library.h>

#ifndef HOUCHU_LIB
#define HOUCHU_LIB houchu_cpu
#endif

// Two steps, so HOUCHU_LIB is expanded before TORCH_LIBRARY_* stringifies its argument.
#define HOUCHU_FRAGMENT_(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define HOUCHU_FRAGMENT(m) HOUCHU_FRAGMENT_(HOUCHU_LIB, m)
#define HOUCHU_IMPL_(ns, m) TORCH_LIBRARY_IMPL(ns, CPU, m)
#define HOUCHU_IMPL(m) HOUCHU_IMPL_(HOUCHU_LIB, m)
