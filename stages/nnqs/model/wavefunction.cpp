#include "stages/nnqs/model/wavefunction.hpp"

#include <cmath>
#include <limits>

namespace qstage::nnqs {

namespace F = torch::nn::functional;
using torch::indexing::None;
using torch::indexing::Slice;

namespace {
constexpr int kStates = 4;     // an orbital's occupations: empty, alpha, beta, both
constexpr int kStartToken = 4;  // the token before orbital 0
}  // namespace

WavefunctionImpl::WavefunctionImpl(const WavefunctionShape& shape) : shape_(shape) {
  const int n = shape.norb, d = shape.embedding;
  tokens_ = register_module("tokens", torch::nn::Embedding(kStates + 1, d));
  positions_ = register_module("positions", torch::nn::Embedding(n, d));
  const auto layer = torch::nn::TransformerEncoderLayer(
      torch::nn::TransformerEncoderLayerOptions(d, shape.heads).dim_feedforward(4 * d).dropout(0.0).activation(torch::kGELU));
  decoder_ = register_module("decoder", torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(layer, shape.layers)));
  logits_ = register_module("logits", torch::nn::Linear(d, kStates));
  phase_ = torch::nn::Sequential();
  int width = 2 * n;
  for (const int hidden : shape.phase_hidden) {
    phase_->push_back(torch::nn::Linear(width, hidden));
    phase_->push_back(torch::nn::GELU());
    width = hidden;
  }
  phase_->push_back(torch::nn::Linear(width, 1));
  register_module("phase", phase_);
  causal_ = register_buffer(
      "causal", torch::triu(torch::full({n, n}, -std::numeric_limits<double>::infinity()), 1));
  remaining_ = register_buffer("remaining", (n - 1) - torch::arange(n, torch::kLong));
  // (what each of the 4 occupations adds to the alpha and beta electrons: buffers, so that they
  // live on the network's device)
  alpha_adds_ = register_buffer("alpha_adds", torch::tensor(std::vector<std::int64_t>{0, 1, 0, 1}, torch::kLong));
  beta_adds_ = register_buffer("beta_adds", torch::tensor(std::vector<std::int64_t>{0, 0, 1, 1}, torch::kLong));
}

std::pair<torch::Tensor, torch::Tensor> WavefunctionImpl::forward(const torch::Tensor& occupations) {
  const std::int64_t batch = occupations.size(0), n = shape_.norb;
  const torch::Tensor alpha = occupations.index({Slice(), Slice(0, None, 2)}).to(torch::kLong);
  const torch::Tensor beta = occupations.index({Slice(), Slice(1, None, 2)}).to(torch::kLong);
  const torch::Tensor states = alpha + 2 * beta;  // (batch, n): 0 empty, 1 alpha, 2 beta, 3 both
  const torch::Tensor inputs =
      torch::cat({torch::full({batch, 1}, kStartToken, torch::TensorOptions(torch::kLong).device(occupations.device())),
                  states.narrow(1, 0, n - 1)},
                 1);
  torch::Tensor h = tokens_(inputs) + positions_->weight.unsqueeze(0);  // (batch, n, d)
  h = decode(h, occupations.is_cuda() ? Decoder::written_out : Decoder::module);
  torch::Tensor logits = logits_(h);  // (batch, n, 4)
  // Which occupations of orbital k leave a determinant with NELEC and MS2 possible: the electrons
  // of each spin placed so far, plus this orbital's, at most all of them and short by at most the
  // orbitals after k.
  const auto spin_constraint = [&](const torch::Tensor& occupied, int electrons, const torch::Tensor& adds) {
    const torch::Tensor before = (occupied.cumsum(1) - occupied).unsqueeze(2);  // (batch, n, 1)
    const torch::Tensor after = before + adds.view({1, 1, kStates});
    return (after <= electrons) & ((electrons - after) <= remaining_.view({1, n, 1}));
  };
  const torch::Tensor allowed =
      spin_constraint(alpha, shape_.nalpha, alpha_adds_) & spin_constraint(beta, shape_.nbeta, beta_adds_);
  logits = logits.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  const torch::Tensor log_p = F::log_softmax(logits, F::LogSoftmaxFuncOptions(2)).gather(2, states.unsqueeze(2)).squeeze(2);
  const torch::Tensor log_amplitude = 0.5 * log_p.sum(1);
  const torch::Tensor phase = phase_->forward(2 * occupations - 1).squeeze(1);
  return {log_amplitude, phase};
}

namespace {

// LayerNorm over the last dimension as its definition reads: (x - mean) / sqrt(var + eps) w + b.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::nn::LayerNormImpl& norm) {
  const auto [var, mean] = torch::var_mean(x, {-1}, /*unbiased=*/false, /*keepdim=*/true);
  return (x - mean) * torch::rsqrt(var + norm.options.eps()) * norm.weight + norm.bias;
}

// One post-norm TransformerEncoderLayer (what LibTorch's module computes: self-attention of
// `heads` heads under the additive mask, residual, LayerNorm; GELU feed-forward, residual,
// LayerNorm; no dropout) over x (batch, n, d), with that layer's parameters.
torch::Tensor encoder_layer(const torch::Tensor& x, torch::nn::TransformerEncoderLayerImpl& layer, const torch::Tensor& mask) {
  torch::nn::MultiheadAttentionImpl& attention = *layer.self_attn;
  const std::int64_t batch = x.size(0), n = x.size(1), d = x.size(2);
  const std::int64_t heads = attention.options.num_heads(), head_width = d / heads;
  // (q, k, v as (batch, heads, n, head_width) views of one projection)
  const torch::Tensor qkv =
      F::linear(x, attention.in_proj_weight, attention.in_proj_bias).view({batch, n, 3, heads, head_width}).permute({2, 0, 3, 1, 4});
  const torch::Tensor q = qkv[0] * (1.0 / std::sqrt(static_cast<double>(head_width)));
  const torch::Tensor scores = torch::matmul(q, qkv[1].transpose(-1, -2)) + mask;
  const torch::Tensor mixed = torch::matmul(torch::softmax(scores, -1), qkv[2]).transpose(1, 2).reshape({batch, n, d});
  const torch::Tensor h = layer_norm(x + attention.out_proj(mixed), *layer.norm1);
  return layer_norm(h + layer.linear2(F::gelu(layer.linear1(h))), *layer.norm2);
}

}  // namespace

torch::Tensor WavefunctionImpl::decode(const torch::Tensor& h, Decoder how) {
  if (how == Decoder::module) return decoder_(h.transpose(0, 1), causal_).transpose(0, 1);
  torch::Tensor x = h;
  for (const auto& layer : *decoder_->layers) x = encoder_layer(x, *layer->as<torch::nn::TransformerEncoderLayerImpl>(), causal_);
  return x;
}

}  // namespace qstage::nnqs
