// Tensor networks end to end on the cpu backend: circuit -> network -> path -> plan (sliced and
// not) -> contraction, against the state vector; generic networks against a direct sum.
#include <gtest/gtest.h>

#include <complex>
#include <map>
#include <random>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "kernels/statevector.hpp"
#include "stages/tn/circuit.hpp"
#include "stages/tn/contractor.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/path.hpp"
#include "stages/tn/paths/hyper.hpp"
#include "stages/tn/plan.hpp"

using namespace qstage;
using tn::cd;

namespace {

std::vector<cd> state_vector(const tn::Circuit& c) {
  std::vector<cd> s(std::size_t{1} << c.qubits, 0.0);
  s[0] = 1;
  for (const auto& g : c.gates) {
    kernels::ApplyGate a;
    a.state = s.data();
    a.qubits = c.qubits;
    a.gate.k = g.arity();
    for (int j = 0; j < g.arity(); ++j) a.gate.targets[j] = g.qubits[static_cast<size_t>(j)];
    for (size_t i = 0; i < g.matrix.size(); ++i) {
      a.gate.matrix[2 * i] = g.matrix[i].real();
      a.gate.matrix[2 * i + 1] = g.matrix[i].imag();
    }
    kernels::apply_gate_cpu(a);
  }
  return s;
}

// Contracts every slice and sums them (complex128 accumulation), on the cpu backend.
std::vector<cd> contract_all(const tn::Network& net, const tn::Plan& plan, h5::DType dtype,
                             const std::vector<std::uint8_t>& bits) {
  auto backend = detail::make_cpu_backend(1ull << 30, 1ull << 30);
  auto stream = backend->make_stream(true);
  tn::Contractor c(net, plan, dtype, false);
  c.upload(*backend, *stream);
  Buffer arena = backend->alloc_device(std::max<std::uint64_t>(plan.arena_bytes, 1), "arena");
  Buffer out = backend->alloc_device(c.result_elements() * c.element_bytes(), "out");
  std::vector<cd> sum(c.result_elements(), 0.0);
  for (std::int64_t s = 0; s < plan.slices; ++s) {
    c.contract(*stream, static_cast<std::uint64_t>(s), bits, arena.data(), out.data(), nullptr);
    for (std::uint64_t i = 0; i < c.result_elements(); ++i)
      sum[i] += dtype == h5::DType::complex128 ? out.as<cd>()[i] : cd(out.as<std::complex<float>>()[i]);
  }
  return sum;
}

// A path by the hyper-optimizer with a fixed trial count (the same on every machine).
tn::Path find_path(const tn::Network& net, int trials, std::uint64_t seed) {
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  tn::HyperOptions o;
  o.max_seconds = 1e9;
  o.max_trials = trials;
  o.seed = seed;
  return tn::hyper_optimize(search, o).path;
}

std::uint64_t index_of(const std::vector<std::uint8_t>& bits) {
  std::uint64_t idx = 0;
  for (size_t q = 0; q < bits.size(); ++q) idx |= std::uint64_t{bits[q]} << q;
  return idx;
}

}  // namespace

TEST(TensorNetwork, AmplitudesMatchTheStateVectorSlicedOrNot) {
  tn::RandomCircuitOptions o;
  o.rows = 4;
  o.cols = 4;
  o.cycles = 10;
  o.seed = 11;
  const auto circuit = tn::random_circuit(o);
  const auto sv = state_vector(circuit);
  auto net = tn::amplitude_network(circuit);
  net.validate("test");
  const auto path = find_path(net, 16, 1);
  const auto free_plan = tn::make_plan(net, path, {16});
  EXPECT_EQ(free_plan.slices, 1);
  tn::PlanOptions tight{16, free_plan.arena_bytes / 4};  // force slicing
  const auto sliced_plan = tn::make_plan(net, path, tight);
  EXPECT_GT(sliced_plan.slices, 1);
  EXPECT_LE(sliced_plan.slices, 64);
  EXPECT_LE(sliced_plan.arena_bytes, tight.budget_bytes);
  std::mt19937 gen(3);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<std::uint8_t> bits(static_cast<size_t>(circuit.qubits));
    for (auto& b : bits) b = static_cast<std::uint8_t>(gen() & 1);
    const cd want = sv[index_of(bits)];
    for (const auto* plan : {&free_plan, &sliced_plan}) {
      const auto got = contract_all(net, *plan, h5::DType::complex128, bits);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_NEAR(std::abs(got[0] - want), 0, 1e-12 * std::max(1.0, std::abs(want)));
      const auto got64 = contract_all(net, *plan, h5::DType::complex64, bits);
      EXPECT_NEAR(std::abs(got64[0] - want), 0, 1e-5 * std::max(std::abs(want), 1e-3));
    }
  }
}

TEST(TensorNetwork, OpenQubitsGiveAllTheirAmplitudes) {
  tn::RandomCircuitOptions o;
  o.rows = 2;
  o.cols = 4;
  o.cycles = 5;
  o.seed = 4;
  const auto circuit = tn::random_circuit(o);
  const auto sv = state_vector(circuit);
  const std::vector<int> open = {6, 1, 3};
  const auto net = tn::amplitude_network(circuit, open);
  const auto plan = tn::make_plan(net, find_path(net, 8, 2), {16});
  std::vector<std::uint8_t> bits = {1, 0, 0, 0, 1, 1, 0, 1};  // open qubits' bits are ignored
  const auto got = contract_all(net, plan, h5::DType::complex128, bits);
  ASSERT_EQ(got.size(), 8u);
  for (int v = 0; v < 8; ++v) {  // output index: open qubits in the order given, first most significant
    auto b = bits;
    for (size_t j = 0; j < open.size(); ++j) b[static_cast<size_t>(open[j])] = static_cast<std::uint8_t>((v >> (2 - j)) & 1);
    EXPECT_NEAR(std::abs(got[static_cast<size_t>(v)] - sv[index_of(b)]), 0, 1e-12);
  }
}

TEST(TensorNetwork, ExpectationWithLightConeMatchesTheStateVector) {
  const auto graph = tn::random_regular_graph(8, 3, 2);
  const auto circuit = tn::qaoa_maxcut({8, 2, {0.4, 0.7}, {0.3, 0.2}, 2}, graph);
  const auto sv = state_vector(circuit);
  for (const auto& [i, j] : std::vector<std::pair<int, int>>{graph[0], graph[5]}) {
    double want = 0;
    for (std::size_t x = 0; x < sv.size(); ++x) want += std::norm(sv[x]) * ((((x >> i) ^ (x >> j)) & 1) ? -1.0 : 1.0);
    const auto net = tn::expectation_network(circuit, {{i, 'Z'}, {j, 'Z'}});
    net.validate("test");
    const auto plan = tn::make_plan(net, find_path(net, 8, 3), {16});
    const auto got = contract_all(net, plan, h5::DType::complex128, {});
    EXPECT_NEAR(got[0].real(), want, 1e-12);
    EXPECT_NEAR(got[0].imag(), 0, 1e-12);
  }
}

TEST(TensorNetwork, GenericNetworkMatchesADirectSumIncludingBatchModes) {
  // "abc,cdb,de->bae": b is shared by both operands of some step and kept in the output.
  auto net = tn::network_from_einsum("abc,cdb,de->bae", {{"a", 3}, {"b", 2}, {"c", 4}, {"d", 5}, {"e", 2}}, "test");
  tn::fill_random(net, 9);
  net.validate("test");
  const auto& A = net.tensors[0].data;
  const auto& B = net.tensors[1].data;
  const auto& C = net.tensors[2].data;
  std::vector<cd> want(2 * 3 * 2, 0.0);
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 4; ++c)
        for (int d = 0; d < 5; ++d)
          for (int e = 0; e < 2; ++e)
            want[static_cast<size_t>((b * 3 + a) * 2 + e)] +=
                A[static_cast<size_t>((a * 2 + b) * 4 + c)] * B[static_cast<size_t>((c * 5 + d) * 2 + b)] *
                C[static_cast<size_t>(d * 2 + e)];
  for (const auto& path : {tn::Path{{{0, 1}, {2, 3}}}, tn::Path{{{1, 2}, {0, 3}}}, tn::Path{{{0, 2}, {1, 3}}}}) {
    const auto unsliced = tn::make_plan(net, path, {16});
    for (std::uint64_t budget : {unsliced.arena_bytes, unsliced.arena_bytes * 2 / 3}) {
      const auto plan = tn::make_plan(net, path, {16, budget});
      EXPECT_LE(plan.arena_bytes, budget);
      const auto got = contract_all(net, plan, h5::DType::complex128, {});
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(std::abs(got[i] - want[i]), 0, 1e-12) << i;
    }
  }
}

TEST(TensorNetwork, PathImportsAndErrors) {
  auto net = tn::network_from_einsum("ab,bc,cd->ad", {{"a", 2}, {"b", 3}, {"c", 4}, {"d", 5}}, "test");
  // opt_einsum linear [(1, 2), (0, 1)] is SSA [(1, 2), (0, 3)]
  const auto linear = tn::path_from_linear(nlohmann::json::parse("[[1, 2], [0, 1]]"), 3, "p");
  EXPECT_EQ(linear.ssa, (std::vector<std::pair<int, int>>{{1, 2}, {0, 3}}));
  const auto ssa = tn::path_from_ssa(nlohmann::json::parse("[[0, 1, 2]]"), 3, "p");
  EXPECT_EQ(ssa.ssa, (std::vector<std::pair<int, int>>{{0, 1}, {3, 2}}));
  EXPECT_THROW(tn::path_cost(net, tn::Path{{{0, 1}}}), InputError);           // too short
  EXPECT_THROW(tn::path_cost(net, tn::Path{{{0, 1}, {0, 2}}}), InputError);   // id used twice
  EXPECT_THROW(tn::path_from_linear(nlohmann::json::parse("[[0, 7]]"), 3, "p"), InputError);
  const auto cost = tn::path_cost(net, linear);
  EXPECT_DOUBLE_EQ(cost.multiply_adds, 3 * 4 * 5 + 2 * 3 * 5);  // bc,cd: b c d; then ab,bd: a b d
  EXPECT_DOUBLE_EQ(cost.largest, 20);                            // cd (4 x 5) and the bd intermediate (3 x 5 = 15)
}

TEST(TensorNetwork, BudgetTooSmallEvenWithSlicingIsInputError) {
  auto net = tn::network_from_einsum("ab,bc->ac", {{"a", 64}, {"b", 2}, {"c", 64}}, "test");
  // The output (64 x 64) cannot be sliced away.
  EXPECT_THROW(tn::make_plan(net, tn::Path{{{0, 1}}}, {16, 1024}), InputError);
}
