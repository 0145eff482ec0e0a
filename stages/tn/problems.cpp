#include "stages/tn/problems.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/random.hpp"

namespace qstage::tn {
namespace {

using nlohmann::json;

// The j-th number of the seeded stream, uniform on [0, 1).
double uniform01(std::uint64_t key, std::uint64_t j) { return static_cast<double>(kernels::random_bits(key, j) >> 11) * 0x1p-53; }

// Builds a network of extent-2 modes tensor by tensor.
struct Builder {
  Network net;
  Mode next = 0;
  Mode mode() {
    net.extent[next] = 2;
    return next++;
  }
  void add(std::vector<Mode> modes, std::vector<cd> data, std::string tag) {
    net.tensors.push_back({std::move(modes), std::move(data), std::move(tag), -1});
  }
};

// Over k binary modes: `zero` where all are 0, `one` where all are 1, 0 elsewhere (a variable
// shared by k constraints, with its weight).
std::vector<cd> copy_tensor(std::size_t k, cd zero, cd one) {
  std::vector<cd> t(std::size_t{1} << k);
  t.front() = zero;
  t.back() += one;  // (k = 0 would be one value; callers never ask for it)
  return t;
}

// Over k binary modes: 1 where their XOR equals `parity`, 0 elsewhere.
std::vector<cd> parity_tensor(std::size_t k, int parity) {
  std::vector<cd> t(std::size_t{1} << k);
  for (std::size_t i = 0; i < t.size(); ++i)
    if (static_cast<int>(std::popcount(i) & 1) == parity) t[i] = 1.0;
  return t;
}

void check_probability(double v, const char* name, bool zero_allowed) {
  if (!std::isfinite(v) || v > 0.5 || v < 0 || (!zero_allowed && v == 0))
    throw InputError(fmt::format("surface_code: {} = {}; expected a probability in {}0, 0.5]", name, v, zero_allowed ? "[" : "("));
}

}  // namespace

Problem king_independent_sets(const IndependentSetOptions& o) {
  if (o.rows < 1 || o.cols < 1 || static_cast<std::int64_t>(o.rows) * o.cols > (1 << 20))
    throw InputError(fmt::format("independent_sets: {} x {} sites; expected 1 to 2^20 sites", o.rows, o.cols));
  if (!(o.fill >= 0 && o.fill <= 1)) throw InputError(fmt::format("independent_sets: fill = {}; expected 0 to 1", o.fill));
  if (!std::isfinite(o.fugacity)) throw InputError(fmt::format("independent_sets: fugacity = {}; expected a finite number", o.fugacity));
  const std::uint64_t key = kernels::splitmix64(o.seed ^ 0x4b696e6773ULL);
  std::vector<int> index(static_cast<std::size_t>(o.rows) * o.cols, -1);  // site -> vertex, -1 where removed
  json sites = json::array();
  int vertices = 0;
  for (int r = 0; r < o.rows; ++r)
    for (int c = 0; c < o.cols; ++c)
      if (uniform01(key, static_cast<std::uint64_t>(r) * o.cols + c) < o.fill) {
        index[static_cast<std::size_t>(r) * o.cols + c] = vertices++;
        sites.push_back({r, c});
      }
  if (vertices == 0)
    throw InputError(fmt::format("independent_sets: no site of the {} x {} grid kept at fill {} (seed {}); expected a larger "
                                 "fill or grid", o.rows, o.cols, o.fill, o.seed));
  auto at = [&](int r, int c) { return r < 0 || c < 0 || r >= o.rows || c >= o.cols ? -1 : index[static_cast<std::size_t>(r) * o.cols + c]; };
  Builder b;
  std::vector<std::vector<Mode>> legs(static_cast<std::size_t>(vertices));
  json edges = json::array();
  for (int r = 0; r < o.rows; ++r)
    for (int c = 0; c < o.cols; ++c) {
      const int u = at(r, c);
      if (u < 0) continue;
      // (each edge once: the neighbours right, below left, below and below right)
      for (const auto& [dr, dc] : {std::pair{0, 1}, {1, -1}, {1, 0}, {1, 1}}) {
        const int v = at(r + dr, c + dc);
        if (v < 0) continue;
        const Mode mu = b.mode(), mv = b.mode();
        legs[static_cast<std::size_t>(u)].push_back(mu);
        legs[static_cast<std::size_t>(v)].push_back(mv);
        b.add({mu, mv}, {1.0, 1.0, 1.0, 0.0}, fmt::format("edge {} {}", u, v));
        edges.push_back({u, v});
      }
    }
  for (int v = 0; v < vertices; ++v) {
    auto& l = legs[static_cast<std::size_t>(v)];
    const std::string tag = fmt::format("vertex {} ({}, {})", v, sites[static_cast<std::size_t>(v)][0].get<int>(),
                                        sites[static_cast<std::size_t>(v)][1].get<int>());
    if (l.empty()) {  // (a mode must join two tensors: the vertex's weights and a sum over it)
      const Mode m = b.mode();
      b.add({m}, {1.0, o.fugacity}, tag);
      b.add({m}, {1.0, 1.0}, fmt::format("sum over vertex {}", v));
      continue;
    }
    b.add(l, copy_tensor(l.size(), 1.0, o.fugacity), tag);
  }
  b.net.description = fmt::format("independent sets of a King's subgraph: {} of {} x {} sites (fill {}, seed {}), {} edges, "
                                  "fugacity {}", vertices, o.rows, o.cols, o.fill, o.seed, edges.size(), o.fugacity);
  Problem p{std::move(b.net), json::object()};
  p.about = {{"problem", "independent_sets"}, {"graph", "king"}, {"rows", o.rows}, {"cols", o.cols}, {"fill", o.fill},
             {"seed", o.seed}, {"fugacity", o.fugacity}, {"vertices", vertices}, {"sites", sites}, {"edges", edges},
             {"value", "sum over the independent sets S of fugacity^|S|"}};
  return p;
}

Problem surface_code_decoding(const SurfaceCodeOptions& o) {
  const int d = o.distance, T = o.rounds;
  if (d < 3 || d > 51 || d % 2 == 0) throw InputError(fmt::format("surface_code: distance = {}; expected an odd number from 3 to 51", d));
  if (T < 1 || T > 1000) throw InputError(fmt::format("surface_code: rounds = {}; expected 1 to 1000", T));
  const double q = o.q.value_or(o.p);
  check_probability(o.p, "p", false);
  check_probability(q, "q", true);
  // The Z checks: corners (i, j) of the data grid, 0 <= i, j <= d, Z where i + j is odd; weight 4
  // inside, weight 2 on the left and right edges (the X checks take the top and bottom ones).
  std::vector<std::vector<int>> checks;
  for (int i = 0; i <= d; ++i)
    for (int j = 0; j <= d; ++j) {
      if ((i + j) % 2 == 0 || i == 0 || i == d) continue;
      std::vector<int> qubits;
      for (const auto& [r, c] : {std::pair{i - 1, j - 1}, {i - 1, j}, {i, j - 1}, {i, j}})
        if (r >= 0 && c >= 0 && r < d && c < d) qubits.push_back(r * d + c);
      checks.push_back(std::move(qubits));
    }
  const auto S = static_cast<int>(checks.size());  // (d^2 - 1) / 2
  const int detectors = S * T;
  std::vector<std::vector<int>> checks_of(static_cast<std::size_t>(d) * d);
  for (int s = 0; s < S; ++s)
    for (int qb : checks[static_cast<std::size_t>(s)]) checks_of[static_cast<std::size_t>(qb)].push_back(s);

  // The syndrome: given, or from a sampled error (data flips round by round, then the
  // measurement flips of every round but the last).
  std::string syndrome;
  std::optional<int> true_class;
  if (o.syndrome) {
    syndrome = *o.syndrome;
    if (static_cast<int>(syndrome.size()) != detectors || syndrome.find_first_not_of("01") != std::string::npos)
      throw InputError(fmt::format("surface_code: syndrome has {} characters{}; expected {} characters 0 or 1 ({} checks x {} "
                                   "rounds)", syndrome.size(), syndrome.find_first_not_of("01") != std::string::npos ? " other than 0 and 1" : "",
                                   detectors, S, T));
  } else {
    const std::uint64_t key = kernels::splitmix64(o.seed ^ 0x5c0deULL);
    std::uint64_t j = 0;
    std::vector<int> bits(static_cast<std::size_t>(detectors), 0);
    int cls = 0;
    for (int t = 0; t < T; ++t)
      for (int qb = 0; qb < d * d; ++qb)
        if (uniform01(key, j++) < o.p) {
          for (int s : checks_of[static_cast<std::size_t>(qb)]) bits[static_cast<std::size_t>(t * S + s)] ^= 1;
          if (qb < d) cls ^= 1;
        }
    for (int t = 0; t + 1 < T; ++t)
      for (int s = 0; s < S; ++s)
        if (uniform01(key, j++) < q) bits[static_cast<std::size_t>(t * S + s)] ^= 1, bits[static_cast<std::size_t>((t + 1) * S + s)] ^= 1;
    for (int bit : bits) syndrome.push_back(static_cast<char>('0' + bit));
    true_class = cls;
  }

  Builder b;
  std::vector<std::vector<Mode>> detector_legs(static_cast<std::size_t>(detectors));
  std::vector<Mode> logical_legs;
  for (int t = 0; t < T; ++t)
    for (int qb = 0; qb < d * d; ++qb) {
      std::vector<Mode> legs;
      for (int s : checks_of[static_cast<std::size_t>(qb)]) {
        legs.push_back(b.mode());
        detector_legs[static_cast<std::size_t>(t * S + s)].push_back(legs.back());
      }
      if (qb < d) {
        legs.push_back(b.mode());
        logical_legs.push_back(legs.back());
      }
      if (!legs.empty()) b.add(legs, copy_tensor(legs.size(), 1 - o.p, o.p), fmt::format("flip q{} r{}", qb, t));
    }
  for (int t = 0; t + 1 < T; ++t)
    for (int s = 0; s < S; ++s) {
      const Mode now = b.mode(), after = b.mode();
      detector_legs[static_cast<std::size_t>(t * S + s)].push_back(now);
      detector_legs[static_cast<std::size_t>((t + 1) * S + s)].push_back(after);
      b.add({now, after}, copy_tensor(2, 1 - q, q), fmt::format("misread check {} r{}", s, t));
    }
  for (int k = 0; k < detectors; ++k)
    b.add(detector_legs[static_cast<std::size_t>(k)], parity_tensor(detector_legs[static_cast<std::size_t>(k)].size(), syndrome[static_cast<std::size_t>(k)] - '0'),
          fmt::format("detector {} r{}", k % S, k / S));
  // The class: the flips' parity on Z_L, summed along a chain of XORs (one tensor of d T legs
  // would hold 2^(d T) values); the chain's last carry is the output.
  Mode carry = logical_legs.front();
  for (std::size_t k = 1; k < logical_legs.size(); ++k) {
    const Mode next = b.mode();
    b.add({logical_legs[k], carry, next}, parity_tensor(3, 0), fmt::format("class parity {}", k));
    carry = next;
  }
  b.net.output = {carry};
  b.net.description = fmt::format("maximum-likelihood decoding of the distance-{} rotated surface code, {} round{} (p = {}, q = {}): "
                                  "[P(syndrome, class 0), P(syndrome, class 1)]", d, T, T == 1 ? "" : "s", o.p, q);
  std::vector<int> row_zero(static_cast<std::size_t>(d));
  for (int c = 0; c < d; ++c) row_zero[static_cast<std::size_t>(c)] = c;
  Problem p{std::move(b.net), json::object()};
  p.about = {{"problem", "surface_code"}, {"distance", d}, {"rounds", T}, {"p", o.p}, {"q", q}, {"checks", checks},
             {"logical", row_zero},
             {"detectors", detectors}, {"syndrome", syndrome}, {"sampled", !o.syndrome.has_value()},
             {"value", "[P(syndrome, class 0), P(syndrome, class 1)]: the class is the bit flips' parity on the data qubits of 'logical'"}};
  if (!o.syndrome) p.about["seed"] = o.seed;
  if (true_class) p.about["true_class"] = *true_class;
  return p;
}

}  // namespace qstage::tn
