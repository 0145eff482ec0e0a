#pragma once
// The neural-network quantum state of sci.nnqs (seed 004, section 5; the NNQS-Transformer of Wu
// et al., SC'23): psi(x) = |psi(x)| exp(i phi(x)) over determinants x of NORB spatial orbitals.
//
// - |psi(x)|^2 is an autoregressive product of conditionals, one a spatial orbital k, over its four
//   occupations (empty, alpha, beta, both): p(x) = prod_k p(s_k | s_0..s_{k-1}). A decoder-only
//   Transformer (token and position embeddings, `layers` self-attention layers with a causal mask,
//   `heads` heads, width `embedding`) reads [start, s_0, ..., s_{NORB-2}] and gives each
//   position's four logits. Occupations that would leave more electrons of a spin than orbitals
//   remain, or place more than there are, get no probability, so sum_x p(x) = 1 over exactly the
//   determinants with the FCIDUMP's NELEC and MS2.
// - phi(x) is a multilayer perceptron (hidden widths `phase_hidden`, GELU) of the 2 NORB spin
//   orbitals' occupations as +-1.
//
// Input: occupations (batch, 2 NORB) of the module's dtype, spin orbital 2p being orbital p's
// alpha and 2p + 1 its beta (Dice's numbering, as the `occupation` parameter). A TorchScript
// module given as `model_file` takes the same input and returns the same pair.
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "stages/nnqs/network.hpp"

namespace qstage::nnqs {

using WavefunctionShape = NetworkShape;

class WavefunctionImpl : public torch::nn::Module {
 public:
  explicit WavefunctionImpl(const WavefunctionShape& shape);
  // log |psi(x)| and phi(x), each (batch,).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& occupations);
  const WavefunctionShape& shape() const { return shape_; }

  // The decoder's layers over h (batch, NORB, embedding), two ways to the same values (to
  // rounding): LibTorch's TransformerEncoder module, or its layers written out batch-first with
  // the module's own parameters, LayerNorm as var_mean. forward() takes the written-out layers
  // on a GPU: there LibTorch's float64 LayerNorm finds each row's moments with a kernel made for
  // long rows, and 32-value rows made it half of an H100's forward pass (72 of 141 ms for 65,536
  // determinants, 24 orbitals); written out, the decoder took 59 ms where the module took 133.
  // On the host the module is faster (and keeps its bits), so forward() uses it there.
  enum class Decoder { module, written_out };
  torch::Tensor decode(const torch::Tensor& h, Decoder how);

 private:
  WavefunctionShape shape_;
  torch::nn::Embedding tokens_{nullptr}, positions_{nullptr};
  torch::nn::TransformerEncoder decoder_{nullptr};  // (decoder-only: self-attention under a causal mask)
  torch::nn::Linear logits_{nullptr};
  torch::nn::Sequential phase_{nullptr};
  torch::Tensor causal_, remaining_;  // buffers: the mask, and orbitals after each position
  torch::Tensor alpha_adds_, beta_adds_;  // buffers: each occupation's alpha and beta electrons
};
TORCH_MODULE(Wavefunction);

}  // namespace qstage::nnqs
