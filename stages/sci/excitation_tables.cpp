#include "stages/sci/excitation_tables.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

namespace qstage::sci {

namespace {

struct Entry {
  int r, s;
  double value;
};

// Sorts a list by |value| descending (ties: (r, s) ascending) and stores it at slot `list`.
void store(std::vector<Entry>& list, std::size_t index, std::uint32_t width, std::vector<std::uint32_t>& length,
           std::vector<std::uint16_t>& target, std::vector<double>& value) {
  std::sort(list.begin(), list.end(), [](const Entry& a, const Entry& b) {
    const double x = std::fabs(a.value), y = std::fabs(b.value);
    if (x != y) return x > y;
    return a.r != b.r ? a.r < b.r : a.s < b.s;
  });
  length[index] = static_cast<std::uint32_t>(list.size());
  for (std::size_t k = 0; k < list.size(); ++k) {
    target[index * width + k] = static_cast<std::uint16_t>(list[k].r | (list[k].s << 8));
    value[index * width + k] = list[k].value;
  }
}

}  // namespace

std::uint64_t ExcitationTables::bytes() const {
  return (coulomb.size() + exchange.size() + single_bound.size() + opposite_value.size() + same_value.size()) * 8 +
         (single_length.size() + opposite_length.size() + same_length.size()) * 4 + single_target.size() +
         (opposite_target.size() + same_target.size()) * 2;
}

ExcitationTables build_excitation_tables(const Integrals& ints) {
  const int n = ints.norb;
  const auto e = [&](int i, int j, int k, int l) { return ints.eri_at(i, j, k, l); };
  ExcitationTables t;
  t.norb = n;
  const std::size_t nn = static_cast<std::size_t>(n) * n;
  t.coulomb.resize(nn);
  t.exchange.resize(nn);
  for (int p = 0; p < n; ++p)
    for (int q = 0; q < n; ++q) {
      t.coulomb[p * n + q] = e(p, p, q, q);
      t.exchange[p * n + q] = e(p, q, q, p);
    }

  // Singles.
  std::vector<std::vector<Entry>> singles(n);
  for (int p = 0; p < n; ++p)
    for (int r = 0; r < n; ++r) {
      if (r == p) continue;
      // Orbital k adds J = (pr|kk) - K, K = (pk|kr), with an electron of the same spin, J with one of
      // the other, 2J - K with both: the bound takes the largest of the three for every k.
      double bound = std::fabs(ints.h1_at(p, r));
      for (int k = 0; k < n; ++k) {
        const double j = e(p, r, k, k), same = j - e(p, k, k, r);
        bound += std::max({std::fabs(j), std::fabs(same), std::fabs(j + same)});
      }
      if (bound > 0) singles[p].push_back({r, 0, bound});
    }
  for (const auto& l : singles) t.single_width = std::max<std::uint32_t>(t.single_width, static_cast<std::uint32_t>(l.size()));
  t.single_length.assign(n, 0);
  t.single_target.assign(n * static_cast<std::size_t>(t.single_width), 0);
  t.single_bound.assign(n * static_cast<std::size_t>(t.single_width), 0.0);
  {
    std::vector<std::uint16_t> targets(t.single_target.size());
    for (int p = 0; p < n; ++p) store(singles[p], p, t.single_width, t.single_length, targets, t.single_bound);
    for (std::size_t k = 0; k < targets.size(); ++k) t.single_target[k] = static_cast<std::uint8_t>(targets[k] & 0xff);
  }

  // Opposite-spin doubles.
  std::vector<std::vector<Entry>> opposite(nn);
  for (int p = 0; p < n; ++p)
    for (int q = 0; q < n; ++q)
      for (int r = 0; r < n; ++r) {
        if (r == p) continue;
        for (int s = 0; s < n; ++s) {
          if (s == q) continue;
          const double v = e(p, r, q, s);
          if (v != 0) opposite[p * n + q].push_back({r, s, v});
        }
      }
  for (const auto& l : opposite) t.opposite_width = std::max<std::uint32_t>(t.opposite_width, static_cast<std::uint32_t>(l.size()));
  t.opposite_length.assign(nn, 0);
  t.opposite_target.assign(nn * t.opposite_width, 0);
  t.opposite_value.assign(nn * t.opposite_width, 0.0);
  for (std::size_t i = 0; i < nn; ++i) store(opposite[i], i, t.opposite_width, t.opposite_length, t.opposite_target, t.opposite_value);

  // Same-spin doubles.
  const std::size_t pairs = static_cast<std::size_t>(n) * (n - 1) / 2;
  std::vector<std::vector<Entry>> same(pairs);
  for (int q = 1; q < n; ++q)
    for (int p = 0; p < q; ++p)
      for (int s = 1; s < n; ++s)
        for (int r = 0; r < s; ++r) {
          if (r == p || r == q || s == p || s == q) continue;
          const double v = e(p, r, q, s) - e(p, s, q, r);
          if (v != 0) same[kernels::sci::same_pair(p, q)].push_back({r, s, v});
        }
  for (const auto& l : same) t.same_width = std::max<std::uint32_t>(t.same_width, static_cast<std::uint32_t>(l.size()));
  t.same_length.assign(pairs, 0);
  t.same_target.assign(pairs * t.same_width, 0);
  t.same_value.assign(pairs * t.same_width, 0.0);
  for (std::size_t i = 0; i < pairs; ++i) store(same[i], i, t.same_width, t.same_length, t.same_target, t.same_value);
  return t;
}

std::uint64_t max_candidates_per_source(const ExcitationTables& t, int nalpha, int nbeta) {
  const auto a = static_cast<std::uint64_t>(nalpha), b = static_cast<std::uint64_t>(nbeta);
  return (a + b) * t.single_width + a * b * t.opposite_width + (a * (a - 1) / 2 + b * (b - 1) / 2) * t.same_width;
}

kernels::sci::HamiltonianView host_view(const Integrals& ints, const ExcitationTables& t) {
  kernels::sci::HamiltonianView v;
  v.norb = ints.norb;
  v.core = ints.core;
  v.h1 = ints.h1.data();
  v.eri = ints.eri.data();
  v.coulomb = t.coulomb.data();
  v.exchange = t.exchange.data();
  v.single_width = t.single_width;
  v.single_length = t.single_length.data();
  v.single_target = t.single_target.data();
  v.single_bound = t.single_bound.data();
  v.opposite_width = t.opposite_width;
  v.opposite_length = t.opposite_length.data();
  v.opposite_target = t.opposite_target.data();
  v.opposite_value = t.opposite_value.data();
  v.same_width = t.same_width;
  v.same_length = t.same_length.data();
  v.same_target = t.same_target.data();
  v.same_value = t.same_value.data();
  return v;
}

ResidentHamiltonian::ResidentHamiltonian(Backend& backend, Stream& stream, const Integrals& ints, const ExcitationTables& t) {
  view_ = host_view(ints, t);
  auto upload = [&](const auto*& pointer, std::size_t count) {
    using T = std::remove_cv_t<std::remove_pointer_t<std::remove_reference_t<decltype(pointer)>>>;
    const std::size_t bytes = std::max<std::size_t>(count, 1) * sizeof(T);
    Buffer b = backend.alloc_device(bytes, "selected-CI integrals and excitation tables");
    if (count) backend.copy_to_device(b.data(), pointer, count * sizeof(T), stream);
    pointer = b.as<T>();
    buffers_.push_back(std::move(b));
  };
  upload(view_.h1, ints.h1.size());
  upload(view_.eri, ints.eri.size());
  upload(view_.coulomb, t.coulomb.size());
  upload(view_.exchange, t.exchange.size());
  upload(view_.single_length, t.single_length.size());
  upload(view_.single_target, t.single_target.size());
  upload(view_.single_bound, t.single_bound.size());
  upload(view_.opposite_length, t.opposite_length.size());
  upload(view_.opposite_target, t.opposite_target.size());
  upload(view_.opposite_value, t.opposite_value.size());
  upload(view_.same_length, t.same_length.size());
  upload(view_.same_target, t.same_target.size());
  upload(view_.same_value, t.same_value.size());
  stream.synchronize();
}

std::uint64_t ResidentHamiltonian::bytes(const Integrals& ints, const ExcitationTables& t) {
  return (ints.h1.size() + ints.eri.size()) * 8 + t.bytes() + 13 * 8;
}

}  // namespace qstage::sci
