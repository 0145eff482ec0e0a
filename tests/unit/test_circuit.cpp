// Circuits: gate matrices, the qsim and OpenQASM parsers (with line-numbered errors), the
// generators, and the state-vector kernel against a dense reference.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <random>

#include "circuit_util.hpp"
#include "core/error.hpp"
#include "stages/tn/circuit.hpp"
#include "test_data.hpp"
#include "test_util.hpp"

using namespace qstage;
using tn::cd;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The full 2^n x 2^n matrix of a gate on `qubits` in the state-vector convention (qubit q is
// bit q of the index): built from the gate's own convention by explicit index mapping.
std::vector<cd> full_matrix(const tn::Gate& g, int n) {
  const std::size_t N = std::size_t{1} << n, k = g.qubits.size(), dim = std::size_t{1} << k;
  std::vector<cd> m(N * N, 0.0);
  for (std::size_t col = 0; col < N; ++col)
    for (std::size_t r_local = 0; r_local < dim; ++r_local) {
      std::size_t c_local = 0;
      for (std::size_t j = 0; j < k; ++j) c_local |= ((col >> g.qubits[j]) & 1) << (k - 1 - j);
      std::size_t row = col;
      for (std::size_t j = 0; j < k; ++j) {
        row &= ~(std::size_t{1} << g.qubits[j]);
        row |= ((r_local >> (k - 1 - j)) & 1) << g.qubits[j];
      }
      m[row * N + col] += g.matrix[r_local * dim + c_local];
    }
  return m;
}

std::vector<cd> simulate_dense(const tn::Circuit& c) {
  const std::size_t N = std::size_t{1} << c.qubits;
  std::vector<cd> s(N, 0.0);
  s[0] = 1;
  for (const auto& g : c.gates) {
    const auto m = full_matrix(g, c.qubits);
    std::vector<cd> t(N, 0.0);
    for (std::size_t r = 0; r < N; ++r)
      for (std::size_t col = 0; col < N; ++col) t[r] += m[r * N + col] * s[col];
    s = t;
  }
  return s;
}

}  // namespace

TEST(Gates, EveryGateIsUnitary) {
  for (const char* name : {"h", "t", "x", "y", "z", "s", "sdg", "tdg", "x_1_2", "y_1_2", "hz_1_2", "sx", "sxdg", "id2",
                           "cx", "cy", "cz", "ch", "swap", "is", "ccx", "cswap"}) {
    const auto m = tn::gate_matrix(name, {}, "test");
    const auto n = static_cast<size_t>(std::lround(std::sqrt(m.size())));
    for (size_t r = 0; r < n; ++r)
      for (size_t c = 0; c < n; ++c) {
        cd dot = 0;
        for (size_t k = 0; k < n; ++k) dot += m[r * n + k] * std::conj(m[c * n + k]);
        EXPECT_NEAR(std::abs(dot - (r == c ? 1.0 : 0.0)), 0, 1e-14) << name;
      }
  }
  for (const char* name : {"rx", "ry", "rz", "u1", "p", "rzz", "rxx", "crz", "cu1", "cp_qsim"}) {
    const auto m = tn::gate_matrix(name, {0.37}, "test");
    const auto n = static_cast<size_t>(std::lround(std::sqrt(m.size())));
    cd det_check = 0;
    for (size_t k = 0; k < n; ++k) det_check += m[k] * std::conj(m[k]);
    EXPECT_NEAR(det_check.real(), 1.0, 1e-14) << name;
  }
  // x_1_2 squared is X; fs(pi/2, 0) swaps |01> and |10> with a -i.
  const auto sx = tn::gate_matrix("x_1_2", {}, "test");
  EXPECT_NEAR(std::abs(sx[0] * sx[0] + sx[1] * sx[2]), 0, 1e-15);
  EXPECT_NEAR(std::abs(sx[0] * sx[1] + sx[1] * sx[3] - 1.0), 0, 1e-15);
  const auto fs = tn::gate_matrix("fs", {M_PI / 2, 0}, "test");
  EXPECT_NEAR(std::abs(fs[1 * 4 + 2] - cd(0, -1)), 0, 1e-15);
}

TEST(Qsim, ParsesTheSharedCircuit) {
  const auto c = tn::read_circuit(qstage::testing::test_data("circuits/circuit_q24.qsim"));
  EXPECT_EQ(c.qubits, 24);
  EXPECT_GT(c.gates.size(), 300u);
  int two = 0;
  for (const auto& g : c.gates) two += g.arity() == 2;
  EXPECT_GT(two, 0);
  const auto s = tn::read_circuit(qstage::testing::test_data("circuits/circuit_n53_m20_s0_e0_pABCDCDAB.qsim"));
  EXPECT_EQ(s.qubits, 53);
}

TEST(Qsim, ErrorsNameTheLine) {
  auto parse = [](const std::string& text) { return error_of([&] { tn::parse_qsim(text, "c.qsim"); }); };
  EXPECT_NE(parse("2\n0 h 0\n1 frob 1\n").find("c.qsim:3: unknown gate 'frob'"), std::string::npos);
  EXPECT_NE(parse("2\n0 h 5\n").find("c.qsim:2: qubit 5 is out of range"), std::string::npos);
  EXPECT_NE(parse("2\n0 cz 0\n").find("takes 2 qubit(s)"), std::string::npos);
  EXPECT_NE(parse("2\n0 rz 0 abc\n").find("'abc' is not a number"), std::string::npos);
  EXPECT_NE(parse("2\n1 h 0\n0 h 0\n").find("c.qsim:3: gate on qubit 0 at time 0 does not come after"),
            std::string::npos);
  EXPECT_NE(parse("two\n").find("c.qsim:1:"), std::string::npos);
  EXPECT_NE(parse("2\n0 cz 1 1\n").find("names qubit 1 twice"), std::string::npos);
  EXPECT_EQ(parse("2\n0 h 0   \n0 h 1\t\n# comment\n\n1 cz 0 1 \n"), "");  // trailing spaces are fine
}

TEST(Qasm, ParsesRegistersBroadcastAndDefinitions) {
  const auto c = tn::parse_qasm(R"(OPENQASM 2.0;
include "qelib1.inc";
qreg a[2];
qreg b[1];
creg m[3];
gate bell(theta) x, y { h x; cx x, y; rz(theta/2) y; }
h a;                 // broadcast over a
bell(pi) a[1], b[0];
u3(0.1, -pi/4, 2*pi) b[0];
barrier a, b;
measure a[0] -> m[0];
)", "t.qasm");
  EXPECT_EQ(c.qubits, 3);
  ASSERT_EQ(c.gates.size(), 6u);
  EXPECT_EQ(c.gates[0].qubits, std::vector<int>{0});
  EXPECT_EQ(c.gates[1].qubits, std::vector<int>{1});
  EXPECT_EQ(c.gates[3].name, "cx");
  EXPECT_EQ(c.gates[3].qubits, (std::vector<int>{1, 2}));
  EXPECT_NEAR(c.gates[4].params[0], M_PI / 2, 1e-15);
  auto parse = [](const std::string& text) { return error_of([&] { tn::parse_qasm(text, "t.qasm"); }); };
  EXPECT_NE(parse("OPENQASM 2.0;\nqreg q[2];\nfoo q[0];\n").find("t.qasm:3: unknown gate 'foo'"), std::string::npos);
  EXPECT_NE(parse("OPENQASM 2.0;\nqreg q[2];\nh q[7];\n").find("t.qasm:3: qubit q[7] is out of range"), std::string::npos);
  EXPECT_NE(parse("OPENQASM 2.0;\nqreg q[2];\ncx q[0];\n").find("acts on 2 qubit(s)"), std::string::npos);
  EXPECT_NE(parse("OPENQASM 3.0;\n").find("expected OPENQASM 2.0"), std::string::npos);
  EXPECT_NE(parse("OPENQASM 2.0;\nqreg q[1];\nreset q[0];\n").find("t.qasm:3: 'reset' is not supported"), std::string::npos);
  // Angles that are not numbers: at the call, inside a definition (named by the body's line), a literal.
  EXPECT_NE(parse("OPENQASM 2.0;\nqreg q[1];\nrz(0/0) q[0];\n").find("t.qasm:3: angle '0/0' evaluates to nan; expected a finite angle"),
            std::string::npos);
  EXPECT_NE(parse("OPENQASM 2.0;\nqreg q[1];\ngate g(a) x {\n  rx(-a/0) x;\n}\ng(pi) q[0];\n")
                .find("t.qasm:4: angle '-a/0' evaluates to -inf; expected a finite angle"),
            std::string::npos);
  EXPECT_NE(parse("OPENQASM 2.0;\nqreg q[1];\nrz(1e999) q[0];\n").find("t.qasm:3: number '1e999' is out of range"), std::string::npos);
}

TEST(StateVector, KernelMatchesDenseMatricesOnEveryConvention) {
  // Gates on unordered qubits, including three-qubit ones, on 5 qubits.
  tn::Circuit c;
  c.qubits = 5;
  auto add = [&](const char* name, std::vector<int> q, std::vector<double> p = {}) {
    c.gates.push_back({name, q, p, tn::gate_matrix(name, p, "test"), 0, 0});
  };
  add("h", {0});
  add("x_1_2", {3});
  add("cx", {3, 1});
  add("fs", {4, 0}, {0.3, 0.7});
  add("hz_1_2", {2});
  add("ccx", {2, 4, 1});
  add("rzz", {1, 3}, {0.9});
  add("cswap", {0, 4, 2});
  add("u3", {4}, {0.2, 0.4, 0.6});
  const auto want = simulate_dense(c), got = test::state_vector(c);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(std::abs(got[i] - want[i]), 0, 1e-14) << i;
}

TEST(StateVector, CxControlsOnItsFirstQubit) {
  tn::Circuit c;
  c.qubits = 2;
  c.gates.push_back({"x", {0}, {}, tn::gate_matrix("x", {}, "t"), 0, 0});
  c.gates.push_back({"cx", {0, 1}, {}, tn::gate_matrix("cx", {}, "t"), 1, 0});
  const auto s = test::state_vector(c);
  EXPECT_NEAR(std::abs(s[3] - 1.0), 0, 1e-15);  // qubits 0 and 1 set: index 0b11
  // qsim's file format: "cx 0 1" is control 0, target 1 as well.
  const auto q = tn::parse_qsim("2\n0 x 0\n1 cx 0 1\n", "t");
  EXPECT_NEAR(std::abs(test::state_vector(q)[3] - 1.0), 0, 1e-15);
}

TEST(Generators, AreSeededAndWellFormed) {
  tn::RandomCircuitOptions o;
  o.rows = 3;
  o.cols = 4;
  o.cycles = 8;
  o.seed = 5;
  const auto a = tn::random_circuit(o), b = tn::random_circuit(o);
  ASSERT_EQ(a.gates.size(), b.gates.size());
  for (size_t i = 0; i < a.gates.size(); ++i) EXPECT_EQ(a.gates[i].name, b.gates[i].name);
  o.seed = 6;
  const auto d = tn::random_circuit(o);
  bool differs = false;
  for (size_t i = 0; i < std::min(a.gates.size(), d.gates.size()); ++i) differs |= a.gates[i].name != d.gates[i].name;
  EXPECT_TRUE(differs);
  // norm is preserved
  const auto s = test::state_vector(a);
  double norm = 0;
  for (auto v : s) norm += std::norm(v);
  EXPECT_NEAR(norm, 1.0, 1e-12);
  const auto g = tn::random_regular_graph(10, 3, 7);
  EXPECT_EQ(g.size(), 15u);
  std::vector<int> degree(10, 0);
  for (auto [u, v] : g) {
    EXPECT_NE(u, v);
    degree[static_cast<size_t>(u)]++;
    degree[static_cast<size_t>(v)]++;
  }
  for (int dgr : degree) EXPECT_EQ(dgr, 3);
  EXPECT_THROW(tn::random_regular_graph(3, 3, 1), InputError);
  const auto q = tn::qaoa_maxcut({10, 2, {0.1, 0.2}, {0.3, 0.4}, 7}, g);
  EXPECT_EQ(q.gates.size(), 10u + 2 * (15u + 10u));
}

// The lattices of tn.build's `lattice` source: their edge counts (3 x 3: 12 bonds of the square
// lattice, 4 more diagonals for the triangular one, a brick wall of 6 + 3 for the honeycomb's),
// every site's degree at most that of the infinite lattice, the gate count of the Trotter steps,
// and bad inputs.
TEST(Circuit, LatticeDynamicsHasTheLatticesEdgesAndItsTrotterGates) {
  auto options = [](const char* kind) {
    tn::LatticeOptions o;
    o.kind = kind, o.rows = 3, o.cols = 3, o.steps = 2;
    return o;
  };
  const std::pair<const char*, std::pair<std::size_t, int>> cases[] = {
      {"rectangular", {12, 4}}, {"triangular", {16, 6}}, {"hexagonal", {9, 3}}};
  for (const auto& [kind, expected] : cases) {
    const auto edges = tn::lattice_edges(options(kind));
    EXPECT_EQ(edges.size(), expected.first) << kind;
    std::vector<int> degree(9, 0);
    for (const auto& [a, b] : edges) {
      EXPECT_NE(a, b);
      ++degree[static_cast<std::size_t>(a)], ++degree[static_cast<std::size_t>(b)];
    }
    for (int d : degree) EXPECT_LE(d, expected.second) << kind;
    const tn::Circuit c = tn::lattice_dynamics(options(kind));
    EXPECT_EQ(c.qubits, 9);
    EXPECT_EQ(c.gates.size(), 2 * (edges.size() + 9)) << kind;
  }
  tn::LatticeOptions bad = options("kagome");
  EXPECT_THROW(tn::lattice_edges(bad), InputError);
  bad = options("rectangular");
  bad.rows = 1, bad.cols = 1;
  EXPECT_THROW(tn::lattice_edges(bad), InputError);
  bad = options("rectangular");
  bad.steps = 0;
  EXPECT_THROW(tn::lattice_dynamics(bad), InputError);
}
