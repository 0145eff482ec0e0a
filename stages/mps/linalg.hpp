#pragma once
// The dense host building blocks of the MPS code live in kernels/linalg/dense_linalg.hpp (the CPU twins
// of the charge-block kernels use them too); stages/mps names them here.
#include "kernels/linalg/dense_linalg.hpp"
#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

using kernels::matmul;
using kernels::single_threaded_blas;
using kernels::Svd;
using kernels::svd;

}  // namespace qstage::stages::mps
