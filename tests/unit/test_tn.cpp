// Tensor networks end to end on the cpu backend: circuit -> network -> path -> plan (sliced and
// not) -> contraction, against the state vector; generic networks against a direct sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <complex>
#include <csignal>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "backend/backend.hpp"
#include "circuit_util.hpp"
#include "core/error.hpp"
#include "core/signals.hpp"
#include "stages/common/kept.hpp"
#include "stages/tn/circuit.hpp"
#include "stages/tn/contractor.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/path.hpp"
#include "stages/tn/paths/fusion.hpp"
#include "stages/tn/paths/hyper.hpp"
#include "stages/tn/plan.hpp"
#include "stages/tn/problems.hpp"
#include "test_util.hpp"

using namespace qstage;
using test::grid_circuit;
using test::state_vector;
using tn::cd;

namespace {

// Contracts every slice and sums them (complex128 accumulation), on the cpu backend.
std::vector<cd> contract_all(const tn::Network& net, const tn::Plan& plan, h5::DType dtype,
                             const std::vector<std::uint8_t>& bits) {
  auto backend = detail::make_cpu_backend(1ull << 30, 1ull << 30);
  auto stream = backend->make_stream(true);
  tn::Contractor c(net, plan, dtype, kernels::Compute::full);
  c.upload(*backend, *stream);
  Buffer arena = backend->alloc_device(std::max<std::uint64_t>(c.work_bytes(), 1), "arena");
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

// Every work item's raw result, contracted in the order given: (bitstring, slice) pairs.
struct ItemResults {
  std::vector<std::vector<char>> bytes;  // per item
  std::uint64_t prologue_runs = 0;
};
ItemResults contract_items(const tn::Network& net, const tn::Plan& plan, h5::DType dtype,
                           const std::vector<std::pair<std::vector<std::uint8_t>, std::int64_t>>& items) {
  auto backend = detail::make_cpu_backend(1ull << 30, 1ull << 30);
  auto stream = backend->make_stream(true);
  tn::Contractor c(net, plan, dtype, kernels::Compute::full);
  c.upload(*backend, *stream);
  Buffer arena = backend->alloc_device(std::max<std::uint64_t>(c.work_bytes(), 1), "arena");
  const std::uint64_t bytes = c.result_elements() * c.element_bytes();
  Buffer out = backend->alloc_device(bytes, "out");
  ItemResults r;
  for (const auto& [bits, slice] : items) {
    c.contract(*stream, static_cast<std::uint64_t>(slice), bits, arena.data(), out.data(), nullptr);
    r.bytes.emplace_back(out.as<char>(), out.as<char>() + bytes);
  }
  r.prologue_runs = c.prologue_runs();
  return r;
}

// Every slice of each bitstring in turn (bitstring-major, as tn.contract's rows).
std::vector<std::pair<std::vector<std::uint8_t>, std::int64_t>> bitstring_major(
    const std::vector<std::vector<std::uint8_t>>& bitstrings, std::int64_t slices) {
  std::vector<std::pair<std::vector<std::uint8_t>, std::int64_t>> items;
  for (const auto& bits : bitstrings)
    for (std::int64_t s = 0; s < slices; ++s) items.push_back({bits, s});
  return items;
}

// The same plan with and without reuse: the same steps (layouts and GEMM mapping), nothing
// invariant in `plain`, and the flops of `reused` without reuse are those of `plain`.
void expect_same_steps(const tn::Plan& plain, const tn::Plan& reused) {
  ASSERT_EQ(plain.sliced, reused.sliced);
  ASSERT_EQ(plain.steps.size(), reused.steps.size());
  for (size_t s = 0; s < plain.steps.size(); ++s) {
    const auto &x = plain.steps[s], &y = reused.steps[s];
    EXPECT_FALSE(x.invariant || x.a_persistent || x.b_persistent || x.c_persistent);
    EXPECT_EQ(x.a_modes, y.a_modes);
    EXPECT_EQ(x.b_modes, y.b_modes);
    EXPECT_EQ(x.c_modes, y.c_modes);
    EXPECT_EQ(std::tie(x.m, x.n, x.k, x.loops, x.left_is_b, x.execution),
              std::tie(y.m, y.n, y.k, y.loops, y.left_is_b, y.execution));
  }
  EXPECT_EQ(plain.invariant_steps, 0);
  EXPECT_EQ(plain.persistent_bytes, 0u);
  EXPECT_EQ(plain.prologue_arena_bytes, 0u);
  EXPECT_DOUBLE_EQ(plain.flops_per_bitstring(), reused.flops_per_bitstring_without_reuse());
  EXPECT_LT(reused.flops_per_bitstring(), plain.flops_per_bitstring());
}

// Invariant steps read no sliced mode, directly or through earlier steps, and no spilled
// tensor; the root is variant; persistent are exactly the invariant results variant steps read.
void expect_sound_invariance(const tn::Network& net, const tn::Plan& plan) {
  const size_t N = net.tensors.size();
  std::vector<bool> varies(N + plan.steps.size(), false), read_by_variant(N + plan.steps.size(), false);
  for (size_t i = 0; i < N; ++i)
    for (tn::Mode m : net.tensors[i].modes)
      if (std::count(plan.sliced.begin(), plan.sliced.end(), m)) varies[i] = true;
  for (const auto& st : plan.steps) {
    if (st.invariant) EXPECT_FALSE(varies[static_cast<size_t>(st.a)] || varies[static_cast<size_t>(st.b)] || st.spilled());
    varies[static_cast<size_t>(st.c)] = !st.invariant;
    if (!st.invariant) read_by_variant[static_cast<size_t>(st.a)] = read_by_variant[static_cast<size_t>(st.b)] = true;
    EXPECT_EQ(st.a_persistent, st.a >= static_cast<int>(N) && !st.invariant && !varies[static_cast<size_t>(st.a)]);
    EXPECT_EQ(st.b_persistent, st.b >= static_cast<int>(N) && !st.invariant && !varies[static_cast<size_t>(st.b)]);
  }
  for (const auto& st : plan.steps) EXPECT_EQ(st.c_persistent, st.invariant && read_by_variant[static_cast<size_t>(st.c)]);
  if (!plan.steps.empty()) EXPECT_FALSE(plan.steps.back().invariant);
}

std::vector<std::uint8_t> random_bits(int qubits, std::mt19937& gen) {
  std::vector<std::uint8_t> bits(static_cast<size_t>(qubits));
  for (auto& b : bits) b = static_cast<std::uint8_t>(gen() & 1);
  return bits;
}

// Sums the slices of bitstring `b` (items bitstring-major) in complex128.
cd amplitude_of(const ItemResults& r, size_t b, std::int64_t slices, h5::DType dtype) {
  cd sum = 0;
  for (std::int64_t s = 0; s < slices; ++s) {
    const char* p = r.bytes[b * static_cast<size_t>(slices) + static_cast<size_t>(s)].data();
    if (dtype == h5::DType::complex128) {
      cd v;
      std::memcpy(&v, p, sizeof v);
      sum += v;
    } else {
      std::complex<float> v;
      std::memcpy(&v, p, sizeof v);
      sum += cd(v);
    }
  }
  return sum;
}


std::uint64_t index_of(const std::vector<std::uint8_t>& bits) {
  std::uint64_t idx = 0;
  for (size_t q = 0; q < bits.size(); ++q) idx |= std::uint64_t{bits[q]} << q;
  return idx;
}

// One random bitstring's amplitude (complex128) against the state vector, to 1e-12.
void expect_amplitude_matches_statevector(const tn::Circuit& circuit, const tn::Network& net, const tn::Plan& plan,
                                          unsigned seed) {
  const auto sv = state_vector(circuit);
  std::mt19937 gen(seed);
  const auto bits = random_bits(circuit.qubits, gen);
  const auto got = contract_all(net, plan, h5::DType::complex128, bits);
  EXPECT_NEAR(std::abs(got[0] - sv[index_of(bits)]), 0, 1e-12);
}

}  // namespace

TEST(TensorNetwork, AmplitudesMatchTheStateVectorSlicedOrNot) {
  const auto circuit = grid_circuit(4, 4, 10, 11);
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

// A process keeps the last network a step wrote or read, by the step key its file carries; a
// file of another key (a step run again, a replaced output) is read anew, and so is one without.
TEST(TensorNetwork, LoadKeepsTheLastNetworkByItsStepKey) {
  test::TempDir dir;
  const auto first = tn::amplitude_network(grid_circuit(2, 3, 4, 1));
  const auto second = tn::amplitude_network(grid_circuit(2, 3, 4, 2));
  auto write = [](const tn::Network& n, const std::filesystem::path& path, const std::string& key) {
    h5::File f = h5::File::create(path);
    tn::save_network(n, f);
    if (!key.empty()) f.set_attribute(stages::kStepKeyAttribute, key);
  };
  auto same = [](const tn::Network& a, const tn::Network& b) {
    return tn::serialize_network(a) == tn::serialize_network(b);
  };
  auto load = [](const std::filesystem::path& path) {
    return tn::load_network(h5::File::open(path, h5::Mode::read_only));
  };
  ASSERT_FALSE(same(first, second));
  const auto path = dir.path / "net.h5";
  write(first, path, "key-1");
  for (int read = 0; read < 2; ++read) EXPECT_TRUE(same(load(path), first)) << "read " << read;
  write(second, dir.path / "next.h5", "key-2");
  std::filesystem::rename(dir.path / "next.h5", path);
  EXPECT_TRUE(same(load(path), second));
  write(first, path, "");
  EXPECT_TRUE(same(load(path), first));
  // A step that writes a network keeps it: the file of its key is not read.
  tn::keep_network("key-3", second);
  write(first, path, "key-3");
  EXPECT_TRUE(same(load(path), second));
}

// The extents' lookup table follows the map through inserts, writes through [], erases, copies
// and moves; labels outside the table (negative, 2^22 and up) are looked up in the map.
TEST(TensorNetwork, ExtentsLookedUpThroughTheTableAsInTheMap) {
  tn::ModeExtents e{{0, 2}, {5, 3}, {-4, 7}, {(tn::Mode{1} << 22) + 1, 11}};
  e[9] = 4;
  e[5] *= 2;  // through the reference [] returns
  auto expect = [](const tn::ModeExtents& x, const std::map<tn::Mode, std::int64_t>& want) {
    ASSERT_EQ(x.size(), want.size());
    for (const auto& [m, v] : want) EXPECT_EQ(x.at(m), v) << "mode " << m;
    std::vector<tn::Mode> order;
    for (const auto& [m, v] : x) order.push_back(m);
    EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
    EXPECT_THROW((void)x.at(7), std::out_of_range);
    EXPECT_THROW((void)x.at(1 << 23), std::out_of_range);
  };
  const std::map<tn::Mode, std::int64_t> want{{0, 2}, {5, 6}, {-4, 7}, {(tn::Mode{1} << 22) + 1, 11}, {9, 4}};
  expect(e, want);
  EXPECT_EQ(e.erase(5), 1u);
  EXPECT_THROW((void)e.at(5), std::out_of_range);
  EXPECT_EQ(e.count(5), 0u);
  e[5] = 1;  // back, at another node
  EXPECT_EQ(e.at(5), 1);
  tn::ModeExtents copy = e;
  copy[0] = 12;  // the copy's table points into the copy
  EXPECT_EQ(e.at(0), 2);
  EXPECT_EQ(copy.at(0), 12);
  tn::ModeExtents assigned;
  assigned = copy;
  tn::ModeExtents moved = std::move(copy);
  moved[9] = 8;
  EXPECT_EQ(moved.at(9), 8);
  EXPECT_EQ(assigned.at(9), 4);
  EXPECT_TRUE(assigned != moved);
  assigned[9] = 8;
  EXPECT_TRUE(assigned == moved);
  // A network's sizes read them as before.
  tn::Network n;
  n.extent = moved;
  EXPECT_EQ(n.size_of({0, 5, 9}), 12 * 1 * 8);
}

TEST(TensorNetwork, OpenQubitsGiveAllTheirAmplitudes) {
  const auto circuit = grid_circuit(2, 4, 5, 4);
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

// Long sums (k of 4096) over few results a product: looped, one block a result element, where the
// products stay few-result once packed (8 x 8 over x's 4 loops; a and b of 2 the loop modes of 8 x
// 8 products in place, 16 x 16 packed); packed where packing joins the loop modes of one operand
// to m and n into larger products (a and b of 16: x's four batches of 32 x 32). Each with the
// direct sum's values.
TEST(TensorNetwork, LongSumsRunLoopedOnlyOverFewResultsOncePacked) {
  struct Case {
    std::int64_t ab, ij;
    tn::Execution execution;
    std::int64_t m, n, loops;
  };
  for (const Case& c : {Case{1, 8, tn::Execution::looped, 8, 8, 4}, Case{2, 8, tn::Execution::looped, 8, 8, 16},
                        Case{16, 2, tn::Execution::packed, 32, 32, 4}}) {
    const std::int64_t ab = c.ab, ij = c.ij;
    auto net = tn::network_from_einsum("xaik,xbjk->xabij",
                                       {{"x", 4}, {"a", ab}, {"b", ab}, {"i", ij}, {"j", ij}, {"k", 4096}}, "test");
    tn::fill_random(net, 5);
    net.validate("test");
    const auto plan = tn::make_plan(net, tn::Path{{{0, 1}}}, {16});
    ASSERT_EQ(plan.steps.size(), 1u);
    const auto& step = plan.steps[0];
    EXPECT_EQ(step.execution, c.execution) << ab << " " << ij;
    EXPECT_EQ(std::tie(step.m, step.n, step.k, step.loops), std::tie(c.m, c.n, step.k, c.loops)) << ab << " " << ij;
    EXPECT_EQ(step.k, 4096);
    const auto& A = net.tensors[0].data;
    const auto& B = net.tensors[1].data;
    const auto got = contract_all(net, plan, h5::DType::complex128, {});
    ASSERT_EQ(got.size(), static_cast<size_t>(4 * ab * ab * ij * ij));
    for (std::int64_t x = 0; x < 4; ++x)
      for (std::int64_t a = 0; a < ab; ++a)
        for (std::int64_t b = 0; b < ab; ++b)
          for (std::int64_t i = 0; i < ij; ++i)
            for (std::int64_t j = 0; j < ij; ++j) {
              cd want = 0;
              for (std::int64_t k = 0; k < 4096; ++k)
                want += A[static_cast<size_t>(((x * ab + a) * ij + i) * 4096 + k)] *
                        B[static_cast<size_t>(((x * ab + b) * ij + j) * 4096 + k)];
              const auto at = static_cast<size_t>((((x * ab + a) * ab + b) * ij + i) * ij + j);
              EXPECT_NEAR(std::abs(got[at] - want), 0, 1e-9) << at;
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

TEST(TensorNetwork, InvariantStepsRunOncePerBitstringAndEverySliceIsBitwiseTheSame) {
  const auto circuit = grid_circuit(4, 4, 10, 11);
  const auto sv = state_vector(circuit);
  const auto net = tn::amplitude_network(circuit);
  auto path = find_path(net, 16, 1);
  const auto unsliced = tn::make_plan(net, path, {16});
  tn::PlanOptions tight{16, unsliced.arena_bytes / 4};
  tight.reuse_invariant = false;
  const auto plain = tn::make_plan(net, path, tight);
  ASSERT_GE(plain.sliced.size(), 2u);
  ASSERT_LE(plain.sliced.size(), 4u);
  // Reuse on the same sliced path (the budget then allows the persistent region).
  path = plain.path();
  const auto reused = tn::make_plan(net, path, {16});
  expect_same_steps(plain, reused);
  ASSERT_GT(reused.invariant_steps, 0);
  EXPECT_GT(reused.persistent_bytes, 0u);
  EXPECT_GT(reused.predicted_prologue_seconds, 0);
  EXPECT_LT(reused.predicted_seconds, plain.predicted_seconds);
  expect_sound_invariance(net, reused);
  // A budget a byte short of all that reuse: some invariant results are recomputed per slice.
  const tn::PlanOptions short_of_it{16, reused.arena_bytes + reused.persistent_bytes - 1};
  ASSERT_LE(plain.arena_bytes, short_of_it.budget_bytes);
  const auto partly = tn::make_plan(net, path, short_of_it);
  EXPECT_EQ(partly.sliced, plain.sliced);
  EXPECT_GT(partly.invariant_steps, 0);
  EXPECT_LT(partly.invariant_steps, reused.invariant_steps);
  EXPECT_LE(partly.arena_bytes + partly.persistent_bytes, short_of_it.budget_bytes);
  EXPECT_GT(partly.flops_per_bitstring(), reused.flops_per_bitstring());
  EXPECT_LT(partly.flops_per_bitstring(), plain.flops_per_bitstring());
  expect_sound_invariance(net, partly);
  const auto round_tripped = tn::Plan::from_json(reused.to_json());
  std::mt19937 gen(5);
  std::vector<std::vector<std::uint8_t>> bitstrings;
  for (int i = 0; i < 3; ++i) bitstrings.push_back(random_bits(circuit.qubits, gen));
  const auto items = bitstring_major(bitstrings, plain.slices);
  for (auto dtype : {h5::DType::complex128, h5::DType::complex64}) {
    const auto want = contract_items(net, plain, dtype, items);
    const auto got = contract_items(net, round_tripped, dtype, items);
    const auto got_partly = contract_items(net, partly, dtype, items);
    EXPECT_EQ(want.prologue_runs, 0u);
    EXPECT_GE(got.prologue_runs, 1u);
    EXPECT_LE(got.prologue_runs, bitstrings.size());
    for (size_t i = 0; i < items.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(want.bytes[i].data(), got.bytes[i].data(), want.bytes[i].size())) << "item " << i;
      EXPECT_EQ(0, std::memcmp(want.bytes[i].data(), got_partly.bytes[i].data(), want.bytes[i].size())) << "item " << i;
    }
    for (size_t b = 0; b < bitstrings.size(); ++b) {
      const cd amp = amplitude_of(got, b, reused.slices, dtype), truth = sv[index_of(bitstrings[b])];
      const double tol = dtype == h5::DType::complex128 ? 1e-12 * std::max(1.0, std::abs(truth)) : 1e-5 * std::max(std::abs(truth), 1e-3);
      EXPECT_NEAR(std::abs(amp - truth), 0, tol) << "bitstring " << b;
    }
  }
}

// The rates and the seconds predicted from them (tn.plan may have measured the rates) are kept
// apart from the schedule: other rates give the same schedule's JSON, and the two documents read
// back together give the prediction again.
TEST(TensorNetwork, PlanScheduleIsApartFromItsPrediction) {
  const auto circuit = grid_circuit(3, 4, 8, 5);
  const auto net = tn::amplitude_network(circuit);
  const auto path = find_path(net, 8, 1);
  tn::PlanOptions slow{16}, fast{16};
  slow.budget_bytes = fast.budget_bytes = tn::make_plan(net, path, slow).arena_bytes / 4;  // (sliced)
  fast.bandwidth = 3 * slow.bandwidth;
  fast.gemm_rate = 5 * slow.gemm_rate;
  const auto a = tn::make_plan(net, path, slow), b = tn::make_plan(net, path, fast);
  ASSERT_GT(a.slices, 1);
  EXPECT_TRUE(a.to_json() == b.to_json());
  EXPECT_TRUE(a.prediction_json() != b.prediction_json());
  for (const char* rate : {"bandwidth", "gemm_rate", "pcie_bandwidth", "predicted_seconds_per_slice"})
    EXPECT_EQ(b.to_json().count(rate), 0u) << rate;
  const auto read = tn::Plan::from_json(b.to_json(), b.prediction_json());
  EXPECT_EQ(read.gemm_rate, fast.gemm_rate);
  EXPECT_EQ(read.predicted_seconds, b.predicted_seconds);
  EXPECT_EQ(read.predicted_prologue_seconds, b.predicted_prologue_seconds);
  ASSERT_EQ(read.steps.size(), b.steps.size());
  for (size_t s = 0; s < b.steps.size(); ++s) EXPECT_EQ(read.steps[s].predicted_seconds, b.steps[s].predicted_seconds);
  const auto schedule_only = tn::Plan::from_json(b.to_json());
  EXPECT_EQ(schedule_only.predicted_seconds, 0);
  EXPECT_TRUE(schedule_only.to_json().at("steps") == b.to_json().at("steps"));  // (the cost is not read back)
  auto short_prediction = b.prediction_json();
  short_prediction["steps"].erase(0);
  EXPECT_THROW(tn::Plan::from_json(b.to_json(), short_prediction), InputError);
}

TEST(TensorNetwork, PrologueIsRedoneWhenTheBitstringChanges) {
  // Sliced over the first wires of qubits 0 and 1: most of the tree, projections included, is
  // invariant, so the prologue's results differ between bitstrings.
  const auto circuit = grid_circuit(3, 4, 8, 2);
  const auto sv = state_vector(circuit);
  const auto net = tn::amplitude_network(circuit);
  auto path = find_path(net, 16, 3);
  path.sliced = {net.tensors[0].modes[0], net.tensors[1].modes[0]};
  tn::PlanOptions no_reuse{16};
  no_reuse.reuse_invariant = false;
  const auto plain = tn::make_plan(net, path, no_reuse);
  const auto reused = tn::make_plan(net, path, {16});
  ASSERT_EQ(reused.slices, 4);
  expect_same_steps(plain, reused);
  expect_sound_invariance(net, reused);
  bool reads_projections = false;
  for (const auto& st : reused.steps)
    for (int id : {st.a, st.b})
      reads_projections |= st.invariant && id < static_cast<int>(net.tensors.size()) &&
                           net.tensors[static_cast<size_t>(id)].projects_qubit >= 0;
  ASSERT_TRUE(reads_projections);
  std::mt19937 gen(8);
  const auto first = random_bits(circuit.qubits, gen);
  auto flipped = first;
  for (auto& b : flipped) b ^= 1;
  // Bitstring-major: one prologue per bitstring, the first one again after the second.
  const std::vector<std::vector<std::uint8_t>> bitstrings = {first, flipped, first};
  auto items = bitstring_major(bitstrings, reused.slices);
  // Then alternating bitstrings slice by slice: a prologue for every item.
  for (std::int64_t s = 0; s < reused.slices; ++s) {
    items.push_back({flipped, s});
    items.push_back({first, s});
  }
  const auto want = contract_items(net, plain, h5::DType::complex128, items);
  const auto got = contract_items(net, reused, h5::DType::complex128, items);
  EXPECT_EQ(got.prologue_runs, 3u + 2u * static_cast<std::uint64_t>(reused.slices));
  for (size_t i = 0; i < items.size(); ++i)
    EXPECT_EQ(0, std::memcmp(want.bytes[i].data(), got.bytes[i].data(), want.bytes[i].size())) << "item " << i;
  for (size_t b = 0; b < bitstrings.size(); ++b)
    EXPECT_NEAR(std::abs(amplitude_of(got, b, reused.slices, h5::DType::complex128) - sv[index_of(bitstrings[b])]), 0,
                1e-12);
}

TEST(TensorNetwork, InvariantStepsOfGenericAndExpectationNetworksRunOnce) {
  // A chain: slicing b leaves the steps of c..g invariant (for paths that contract them first).
  auto chain = tn::network_from_einsum("ab,bc,cd,de,ef,fg->ag",
                                       {{"a", 3}, {"b", 4}, {"c", 5}, {"d", 6}, {"e", 5}, {"f", 4}, {"g", 3}}, "test");
  tn::fill_random(chain, 4);
  tn::Path chain_path{{{4, 5}, {3, 6}, {2, 7}, {1, 8}, {0, 9}}};
  chain_path.sliced = {1};  // b
  const auto graph = tn::random_regular_graph(8, 3, 2);
  const auto circuit = tn::qaoa_maxcut({8, 2, {0.4, 0.7}, {0.3, 0.2}, 2}, graph);
  const auto expectation = tn::expectation_network(circuit, {{graph[0].first, 'Z'}, {graph[0].second, 'Z'}});
  auto expectation_path = find_path(expectation, 8, 3);
  const auto expectation_plan = tn::make_plan(expectation, expectation_path, {16});
  expectation_path.sliced = {expectation_plan.steps.front().c_modes.front()};  // some closed mode
  if (std::count(expectation.output.begin(), expectation.output.end(), expectation_path.sliced[0]))
    expectation_path.sliced.clear();
  ASSERT_FALSE(expectation_path.sliced.empty());
  using Case = std::pair<const tn::Network*, const tn::Path*>;
  for (const auto& [net, path] : {Case{&chain, &chain_path}, Case{&expectation, &expectation_path}}) {
    tn::PlanOptions no_reuse{16};
    no_reuse.reuse_invariant = false;
    const auto plain = tn::make_plan(*net, *path, no_reuse);
    const auto reused = tn::make_plan(*net, *path, {16});
    expect_same_steps(plain, reused);
    expect_sound_invariance(*net, reused);
    const auto items = bitstring_major({{}}, reused.slices);
    const auto want = contract_items(*net, plain, h5::DType::complex128, items);
    const auto got = contract_items(*net, reused, h5::DType::complex128, items);
    EXPECT_EQ(got.prologue_runs, 1u);
    for (size_t i = 0; i < items.size(); ++i)
      EXPECT_EQ(0, std::memcmp(want.bytes[i].data(), got.bytes[i].data(), want.bytes[i].size())) << "item " << i;
  }
}


TEST(TensorNetwork, SlicingFitsTheArenaAndThePersistentRegion) {
  const auto circuit = grid_circuit(4, 4, 10, 11);
  const auto net = tn::amplitude_network(circuit);
  const auto path = find_path(net, 16, 1);
  const auto unsliced = tn::make_plan(net, path, {16});
  for (std::uint64_t arenas : {1, 3}) {
    tn::PlanOptions tight{16, unsliced.arena_bytes / 8};
    tight.arenas = arenas;
    const auto plan = tn::make_plan(net, path, tight);
    EXPECT_GT(plan.slices, 1);
    EXPECT_GT(plan.invariant_steps, 0);
    EXPECT_LE(plan.arena_bytes + (plan.persistent_bytes + arenas - 1) / arenas, tight.budget_bytes);
    EXPECT_LE(plan.prologue_arena_bytes, plan.arena_bytes);
    expect_sound_invariance(net, plan);
    expect_amplitude_matches_statevector(circuit, net, plan, 1);
  }
}

TEST(TensorNetwork, StepsTouchingSpilledIntermediatesRunPerSlice) {
  const auto circuit = grid_circuit(3, 4, 8, 5);
  const auto net = tn::amplitude_network(circuit);
  const auto path = find_path(net, 16, 1);
  const auto unsliced = tn::make_plan(net, path, {16});
  // The first of a few budgets where this path both spills and slices (too little host memory for
  // all spills) and keeps invariant steps. (Which budgets do depends on how each step runs, so
  // the test tries a few rather than fixing one.)
  tn::PlanOptions ooc{16, 0};
  ooc.out_of_core = true;
  tn::Plan plan;
  for (int device_share : {4, 3, 5, 6, 8})
    for (int host_share : {3, 2, 4, 6}) {
      if (plan.spilled > 0 && plan.slices > 1 && plan.invariant_steps > 0) break;
      ooc.budget_bytes = unsliced.arena_bytes / device_share;
      ooc.host_budget_bytes = unsliced.arena_bytes / host_share;
      plan = tn::make_plan(net, path, ooc);
    }
  ASSERT_GT(plan.slices, 1);
  ASSERT_GT(plan.invariant_steps, 0);
  ASSERT_GT(plan.spilled, 0);
  EXPECT_LE(plan.arena_bytes + plan.persistent_bytes, ooc.budget_bytes);
  expect_sound_invariance(net, plan);
  expect_amplitude_matches_statevector(circuit, net, plan, 2);
}

TEST(DetectorErrorModel, ItsSizeIsBoundedBeforeExpansionAndTheExpansionStopsOnRequest) {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      tn::read_detector_error_model(text, "t.dem");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  // 1 + 2^20 + 2^20 instructions, 2^20 + 1 detectors: one past the limit each, refused before expanding.
  EXPECT_EQ(error_of("repeat 1048576 {\n  error(0.1) D0 L0\n}\n"),
            "t.dem line 1: 'repeat 1048576 {' takes the model to 1048577 instructions (repeat blocks expanded); expected at "
            "most 1048576 (2^20)");
  EXPECT_EQ(error_of("repeat 1024 {\n  repeat 1023 {\n    error(0.1) D0 L0\n  }\n}\n"),
            "t.dem line 1: 'repeat 1024 {' takes the model to 1048577 instructions (repeat blocks expanded); expected at "
            "most 1048576 (2^20)");
  EXPECT_EQ(error_of("shift_detectors 1048576\nerror(0.1) D0 L0\n"),
            "t.dem line 2: 'error(0.1) D0 L0' takes the model to 1048577 detectors (repeat blocks expanded); expected at "
            "most 1048576 (2^20)");
  // At the limit: 3 * 349525 shifted, then D0 is detector 2^20 - 1.
  EXPECT_EQ(tn::read_detector_error_model("repeat 3 {\n  detector D2\n  shift_detectors 349525\n}\nerror(0.1) D0 L0\n", "t.dem").detectors,
            1048576);
  // Within the limit, a stop request ends the expansion (as SIGTERM does a long one).
  signals::request_stop(SIGTERM);
  EXPECT_THROW(tn::read_detector_error_model("repeat 4 {\n  error(0.1) D0 L0\n}\n", "t.dem"), StopRequested);
  signals::request_stop(0);
  EXPECT_EQ(tn::read_detector_error_model("repeat 4 {\n  error(0.1) D0 L0\n  shift_detectors 1\n}\n", "t.dem").detectors, 4);
}

// Chained steps (small looped products, kernels::LoopedChain) come in waves: runs of products
// that read no result of their own run, so the chain runs each run as one stage over the whole
// device. A stage's products never write where another of them reads or writes (tn.plan frees a
// stage's operands only when it ends), there are several times fewer stages than chained steps
// (in the path's own order nearly every chained step reads the one before), and the amplitude is
// the state vector's.
TEST(TensorNetwork, ChainedStepsComeInStagesOfIndependentProducts) {
  const auto circuit = grid_circuit(4, 5, 12, 5);
  const auto net = tn::amplitude_network(circuit);
  const auto plan = tn::make_plan(net, find_path(net, 8, 1), {16});
  ASSERT_EQ(plan.slices, 1);
  const int N = static_cast<int>(net.tensors.size());
  struct Span {
    std::uint64_t begin, end;
  };
  auto in_arena = [&](int id, std::uint64_t offset, std::uint64_t bytes) {
    return id >= N ? Span{offset, offset + bytes} : Span{0, 0};  // (inputs are resident, outside the arena)
  };
  auto overlap = [](Span x, Span y) { return x.begin < y.end && y.begin < x.end; };
  int chained = 0, stages = 0;
  std::vector<const tn::PlanStep*> stage;
  std::set<int> stage_results;
  for (const auto& st : plan.steps) {
    if (!tn::runs_chained(net, st)) {
      stage.clear();
      continue;
    }
    ++chained;
    if (stage.empty() || stage_results.count(st.a) || stage_results.count(st.b)) {
      ++stages;
      stage.clear();
      stage_results.clear();
    }
    const Span c = in_arena(st.c, st.c_offset, st.c_bytes);
    for (const tn::PlanStep* q : stage) {
      const Span qc = in_arena(q->c, q->c_offset, q->c_bytes);
      EXPECT_FALSE(overlap(c, qc) || overlap(c, in_arena(q->a, q->a_offset, q->a_bytes)) ||
                   overlap(c, in_arena(q->b, q->b_offset, q->b_bytes)) ||
                   overlap(qc, in_arena(st.a, st.a_offset, st.a_bytes)) ||
                   overlap(qc, in_arena(st.b, st.b_offset, st.b_bytes)))
          << "step " << st.c - N << " against step " << q->c - N;
    }
    stage.push_back(&st);
    stage_results.insert(st.c);
  }
  EXPECT_GT(chained, 100);
  EXPECT_LE(stages * 4, chained) << stages << " stages of " << chained << " chained steps";
  expect_amplitude_matches_statevector(circuit, net, plan, 7);
}

// The same circuit sliced by a budget, its invariant steps run once per bitstring: the waved
// order keeps each prologue and each slice sound, and the amplitude is the state vector's.
TEST(TensorNetwork, ChainedStepsInWavesAcrossSlicesAndThePrologue) {
  const auto circuit = grid_circuit(4, 5, 12, 5);
  const auto net = tn::amplitude_network(circuit);
  const auto path = find_path(net, 8, 1);
  const auto whole = tn::make_plan(net, path, {16});
  const auto plan = tn::make_plan(net, path, {16, whole.arena_bytes / 4});
  ASSERT_GT(plan.slices, 1);
  ASSERT_GT(plan.invariant_steps, 0);
  int chained = 0, reads_before = 0;  // chained steps, and those that read the step just before
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    if (!tn::runs_chained(net, plan.steps[s])) continue;
    ++chained;
    const int previous = static_cast<int>(net.tensors.size() + s) - 1;
    if (s > 0 && (plan.steps[s].a == previous || plan.steps[s].b == previous)) ++reads_before;
  }
  EXPECT_GT(chained, 100);
  EXPECT_LE(reads_before * 4, chained) << reads_before << " of " << chained;
  expect_sound_invariance(net, plan);
  expect_amplitude_matches_statevector(circuit, net, plan, 8);
}

// Gate fusion (paths/fusion.hpp): chains of gates on one large tensor fold into one pass each. The
// tree stays valid and keeps its result, no tensor grows, the bytes moved fall, and the fused
// plan's amplitudes are the state vector's, as the unfused plan's are; fusing again finds nothing.
TEST(TensorNetwork, FusedGateChainsMoveFewerBytesAndGiveTheStateVectorsAmplitudes) {
  const auto circuit = grid_circuit(4, 5, 12, 5);
  const auto sv = state_vector(circuit);
  const auto net = tn::amplitude_network(circuit);
  const auto path = find_path(net, 8, 1);
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  tn::ContractionTree tree = tn::ContractionTree::from_path(search, path);
  const tn::ContractionTree before = tree;
  tn::FuseOptions small_gates;
  small_gates.min_large_log2 = 8;  // (this 20-qubit circuit's intermediates are small)
  const tn::FuseReport r = tn::fuse_gate_chains(tree, small_gates);
  tree.check();
  EXPECT_GT(r.fused, 0);
  EXPECT_LT(r.moved_after, r.moved_before);
  EXPECT_EQ(tree.legs(tree.root()), before.legs(before.root()));
  EXPECT_LE(tree.cost().log2_largest(), before.cost().log2_largest());
  // The flops grow, within the bound the sum and fan-out caps put on each pass.
  EXPECT_LE(r.multiply_adds_after, r.multiply_adds_before * 16);
  EXPECT_EQ(tn::fuse_gate_chains(tree, small_gates).fused, 0);  // a fixed point

  // Through make_plan: on by default, off on request; every amplitude matches either way.
  tn::PlanOptions plain{16}, fused{16};
  plain.fuse_gates = false;
  const auto p0 = tn::make_plan(net, path, plain), p1 = tn::make_plan(net, path, fused);
  EXPECT_EQ(p0.fused_gates, 0);
  std::uint64_t moved0 = 0, moved1 = 0;
  for (const auto& st : p0.steps) moved0 += tn::moved_bytes(st);
  for (const auto& st : p1.steps) moved1 += tn::moved_bytes(st);
  EXPECT_GT(p1.fused_gates, 0);  // (fewer than above: the default leaves tensors under 4096 values alone)
  EXPECT_LT(moved1, moved0);
  // (Both plans run their chained steps in waves, which moves small results' lifetimes by up to a
  // 16th of the arena either way; fusion itself adds no tensor larger than the chains'.)
  EXPECT_LE(p1.arena_bytes, p0.arena_bytes + p0.arena_bytes / 16);
  EXPECT_EQ(tn::Plan::from_json(p1.to_json()).fused_gates, p1.fused_gates);
  tn::ContractionTree planned = tn::ContractionTree::from_path(search, p1.path());
  EXPECT_EQ(tn::fuse_gate_chains(planned).fused, 0);
  // And the tree fused with small_gates, planned as an imported path.
  const auto p2 = tn::make_plan(net, tree.to_path(), plain);
  std::mt19937 gen(9);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<std::uint8_t> bits(static_cast<size_t>(circuit.qubits));
    for (auto& b : bits) b = static_cast<std::uint8_t>(gen() & 1);
    const cd want = sv[index_of(bits)];
    for (const auto* plan : {&p0, &p1, &p2}) {
      const auto got = contract_all(net, *plan, h5::DType::complex128, bits);
      EXPECT_NEAR(std::abs(got[0] - want), 0, 1e-12 * std::max(1.0, std::abs(want)));
      const auto got64 = contract_all(net, *plan, h5::DType::complex64, bits);
      EXPECT_NEAR(std::abs(got64[0] - want), 0, 1e-5 * std::max(std::abs(want), 1e-3));
    }
  }
}
