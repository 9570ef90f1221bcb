// int4 / int8 weight GEMV kernels (placeholder file: registered operators follow).
#include <torch/library.h>
