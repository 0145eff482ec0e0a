#include "stages/tn/simplify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "core/error.hpp"
#include "kernels/linalg/dense_linalg.hpp"
#include "kernels/linalg/tropical.hpp"

namespace qstage::tn {

using nlohmann::json;

SimplifyOptions SimplifyOptions::from_json(const json& j, const std::string& what) {
  SimplifyOptions o;
  if (j.is_boolean()) {
    o.diagonal = o.column = o.rank = o.split = j.get<bool>();
    return o;
  }
  if (!j.is_array())
    throw InputError(fmt::format("{} is {}; expected true, false or a list of rules (diagonal, column, rank, split)", what,
                                 j.dump()));
  o.diagonal = o.column = o.rank = o.split = false;
  for (const auto& r : j) {
    const std::string name = r.is_string() ? r.get<std::string>() : r.dump();
    if (name == "diagonal") o.diagonal = true;
    else if (name == "column") o.column = true;
    else if (name == "rank") o.rank = true;
    else if (name == "split") o.split = true;
    else throw InputError(fmt::format("{} names rule '{}'; expected diagonal, column, rank or split", what, name));
  }
  return o;
}

json SimplifyReport::to_json() const {
  return {{"tensors_before", tensors_before}, {"tensors_after", tensors_after}, {"modes_before", modes_before},
          {"modes_after", modes_after},       {"hyperindices", hyperindices},   {"fused", fused},
          {"fixed", fixed},                   {"absorbed", absorbed},           {"split", split},
          {"seconds", seconds}};
}

namespace {

// Tensors larger than this are left as they are by the diagonal and column rules (their checks
// read the whole tensor once per pair of legs): inputs are gate-sized, and large ones rare.
constexpr std::int64_t kLargestChecked = std::int64_t{1} << 20;
// The split rule tries every bipartition of a tensor's legs (an SVD each): only tensors of at most
// this many legs and values.
constexpr size_t kMostLegsSplit = 10;
constexpr std::int64_t kLargestSplit = std::int64_t{1} << 12;
// Singular values below this fraction of the largest count as zero: the split changes the tensor
// by about this much (relative), the rounding of a double-precision contraction.
constexpr double kSplitCutoff = 1e-13;

class Simplifier {
 public:
  Simplifier(Network& n, const SimplifyOptions& o) : n_(n), o_(o), tropical_(n.semiring == "tropical") {
    output_.insert(n.output.begin(), n.output.end());
    next_mode_ = n.extent.empty() ? 0 : n.extent.rbegin()->first + 1;
    alive_.assign(n.tensors.size(), 1);
    for (size_t t = 0; t < n.tensors.size(); ++t)
      for (Mode m : n.tensors[t].modes) holders_[m].insert(static_cast<int>(t));
  }

  SimplifyReport run() {
    SimplifyReport r;
    const auto start = std::chrono::steady_clock::now();
    r.tensors_before = n_.tensors.size();
    r.modes_before = n_.extent.size();
    for (bool changed = true; changed;) {
      changed = false;
      if (o_.diagonal) changed |= fuse_diagonals(r);
      if (o_.column) changed |= fix_columns(r);
      if (o_.rank) changed |= absorb(r);
      if (o_.split && !tropical_) changed |= split(r);  // (no SVD in the tropical semiring)
    }
    compact();
    r.tensors_after = n_.tensors.size();
    r.modes_after = n_.extent.size();
    for (const auto& [m, h] : holders_) r.hyperindices += h.size() > 2;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }

 private:
  Network& n_;
  const SimplifyOptions& o_;
  bool tropical_;
  std::set<Mode> output_;
  std::vector<char> alive_;
  std::map<Mode, std::set<int>> holders_;  // alive tensors per mode
  Mode next_mode_ = 0;                     // a label no mode has

  bool zero(cd v) const { return tropical_ ? v.imag() == 0 : v == cd(0); }
  cd times(cd a, cd b) const {
    if (!tropical_) return a * b;
    const auto p = kernels::tropical_times({a.real(), a.imag()}, {b.real(), b.imag()});
    return {p.x, p.n};
  }
  cd plus(cd a, cd b) const {
    if (!tropical_) return a + b;
    const auto p = kernels::tropical_plus({a.real(), a.imag()}, {b.real(), b.imag()});
    return {p.x, p.n};
  }
  cd additive_zero() const { return tropical_ ? cd(-INFINITY, 0) : cd(0); }

  bool editable(int t) const { return alive_[static_cast<size_t>(t)] && n_.tensors[static_cast<size_t>(t)].projects_qubit < 0; }

  std::vector<std::int64_t> strides(const std::vector<Mode>& modes) const {
    std::vector<std::int64_t> s(modes.size(), 1);
    for (size_t p = modes.size(); p-- > 1;) s[p - 1] = s[p] * n_.extent.at(modes[p]);
    return s;
  }

  // Tensor t with its legs relabelled to `labels` (a label twice: the diagonal over those legs) and
  // the modes in `fixed` fixed to their values (those legs removed). The new modes are the labels
  // in order of first appearance, fixed ones left out.
  void reindex(int t, const std::vector<Mode>& labels, const std::map<Mode, std::int64_t>& fixed) {
    NetTensor& T = n_.tensors[static_cast<size_t>(t)];
    const auto old_strides = strides(T.modes);
    std::vector<Mode> modes;
    for (Mode m : labels)
      if (!fixed.count(m) && std::find(modes.begin(), modes.end(), m) == modes.end()) modes.push_back(m);
    std::int64_t offset = 0;  // of the fixed legs
    std::vector<std::int64_t> stride(modes.size(), 0);  // per new mode: its step in the old data
    for (size_t p = 0; p < labels.size(); ++p) {
      if (auto f = fixed.find(labels[p]); f != fixed.end()) {
        offset += f->second * old_strides[p];
      } else {
        const size_t q = static_cast<size_t>(std::find(modes.begin(), modes.end(), labels[p]) - modes.begin());
        stride[q] += old_strides[p];
      }
    }
    std::vector<cd> data = gather(T, modes, stride, offset);
    T.modes = std::move(modes);
    T.data = std::move(data);
  }

  // The values of T over `modes` (row-major, last fastest), where mode p steps stride[p] through
  // T's data from `offset`.
  std::vector<cd> gather(const NetTensor& T, const std::vector<Mode>& modes, const std::vector<std::int64_t>& stride,
                         std::int64_t offset) const {
    std::vector<cd> data(static_cast<size_t>(n_.size_of(modes)));
    std::vector<std::int64_t> index(modes.size(), 0);
    std::int64_t at = offset;
    for (auto& x : data) {
      x = T.data[static_cast<size_t>(at)];
      for (size_t p = modes.size(); p-- > 0;) {  // odometer, last mode fastest
        at += stride[p];
        if (++index[p] < n_.extent.at(modes[p])) break;
        at -= stride[p] * index[p];
        index[p] = 0;
      }
    }
    return data;
  }

  // Whether tensor T is zero wherever its legs p and q differ.
  bool diagonal_on(const NetTensor& T, size_t p, size_t q) const {
    const auto s = strides(T.modes);
    const std::int64_t ep = n_.extent.at(T.modes[p]), eq = n_.extent.at(T.modes[q]);
    for (size_t e = 0; e < T.data.size(); ++e) {
      const std::int64_t ip = static_cast<std::int64_t>(e) / s[p] % ep, iq = static_cast<std::int64_t>(e) / s[q] % eq;
      if (ip != iq && !zero(T.data[e])) return false;
    }
    return true;
  }

  // Every tensor holding `from` holds `to` instead (its diagonal where it held both).
  void rename(Mode from, Mode to) {
    const std::set<int> holders = holders_[from];
    for (int h : holders) {
      std::vector<Mode> labels = n_.tensors[static_cast<size_t>(h)].modes;
      std::replace(labels.begin(), labels.end(), from, to);
      reindex(h, labels, {});
      holders_[to].insert(h);
    }
    holders_.erase(from);
    n_.extent.erase(from);
    n_.labels.erase(from);
  }

  // Applies `once` (which changes tensor t at most once, and says whether it did) to every tensor
  // that may change and is small enough to check, again while it changes; whether any changed.
  template <class Once>
  bool apply_to_each(Once once) {
    bool any = false;
    for (int t = 0; t < static_cast<int>(n_.tensors.size()); ++t) {
      if (!editable(t)) continue;
      while (static_cast<std::int64_t>(n_.tensors[static_cast<size_t>(t)].data.size()) <= kLargestChecked && once(t))
        any = true;
    }
    return any;
  }

  bool fuse_diagonals(SimplifyReport& r) {
    return apply_to_each([&](int t) {
      const NetTensor& T = n_.tensors[static_cast<size_t>(t)];
      for (size_t p = 0; p < T.modes.size(); ++p)
        for (size_t q = p + 1; q < T.modes.size(); ++q) {
          const Mode mp = T.modes[p], mq = T.modes[q];
          if (n_.extent.at(mp) != n_.extent.at(mq) || n_.extent.at(mp) < 2) continue;
          if (output_.count(mp) && output_.count(mq)) continue;  // the output would need its diagonal
          if (!diagonal_on(T, p, q)) continue;
          if (output_.count(mq)) rename(mp, mq);  // output modes keep their labels
          else rename(mq, mp);
          ++r.fused;
          return true;
        }
      return false;
    });
  }

  bool fix_columns(SimplifyReport& r) {
    return apply_to_each([&](int t) {
      const NetTensor& T = n_.tensors[static_cast<size_t>(t)];
      const auto s = strides(T.modes);
      for (size_t p = 0; p < T.modes.size(); ++p) {
        const Mode m = T.modes[p];
        const std::int64_t extent = n_.extent.at(m);
        if (output_.count(m) || extent < 2) continue;
        std::int64_t only = -1;  // the one index with a nonzero slice; -2: several
        for (size_t e = 0; e < T.data.size() && only != -2; ++e) {
          if (zero(T.data[e])) continue;
          const std::int64_t i = static_cast<std::int64_t>(e) / s[p] % extent;
          only = only == -1 || only == i ? i : -2;
        }
        if (only < 0) continue;  // several, or a zero tensor (left for the contraction to find)
        const std::set<int> holders = holders_[m];
        if (std::any_of(holders.begin(), holders.end(), [&](int h) { return !editable(h); })) continue;
        for (int h : holders) reindex(h, n_.tensors[static_cast<size_t>(h)].modes, {{m, only}});
        holders_.erase(m);
        n_.extent.erase(m);
        n_.labels.erase(m);
        ++r.fixed;
        return true;
      }
      return false;
    });
  }

  // Whether the contraction of t and u sums mode m (both hold it, nothing else does, not output).
  bool summed(Mode m, int t, int u) const {
    if (output_.count(m)) return false;
    const auto& h = holders_.at(m);
    return h.size() == 2 && h.count(t) && h.count(u);
  }

  std::vector<Mode> result_modes(int t, int u) const {
    const auto& T = n_.tensors[static_cast<size_t>(t)];
    const auto& U = n_.tensors[static_cast<size_t>(u)];
    std::vector<Mode> out;
    for (Mode m : U.modes)
      if (!summed(m, t, u)) out.push_back(m);
    for (Mode m : T.modes)
      if (std::find(U.modes.begin(), U.modes.end(), m) == U.modes.end()) out.push_back(m);
    return out;
  }

  // u := t . u over result_modes(t, u); t is removed.
  void contract_into(int t, int u) {
    NetTensor& T = n_.tensors[static_cast<size_t>(t)];
    NetTensor& U = n_.tensors[static_cast<size_t>(u)];
    const std::vector<Mode> out = result_modes(t, u);
    std::vector<Mode> sums;
    for (Mode m : T.modes)
      if (summed(m, t, u)) sums.push_back(m);
    const auto st = strides(T.modes), su = strides(U.modes);
    auto stride_in = [&](const NetTensor& X, const std::vector<std::int64_t>& s, Mode m) -> std::int64_t {
      const auto it = std::find(X.modes.begin(), X.modes.end(), m);
      return it == X.modes.end() ? 0 : s[static_cast<size_t>(it - X.modes.begin())];
    };
    std::vector<Mode> all(out);  // result modes, then summed modes (innermost)
    all.insert(all.end(), sums.begin(), sums.end());
    std::vector<std::int64_t> step_t, step_u;
    for (Mode m : all) {
      step_t.push_back(stride_in(T, st, m));
      step_u.push_back(stride_in(U, su, m));
    }
    std::int64_t inner = 1;
    for (Mode m : sums) inner *= n_.extent.at(m);
    const std::int64_t size = n_.size_of(out);
    std::vector<cd> data(static_cast<size_t>(size), additive_zero());
    std::vector<std::int64_t> index(all.size(), 0);
    std::int64_t at_t = 0, at_u = 0;
    for (std::int64_t e = 0; e < size * inner; ++e) {
      auto& x = data[static_cast<size_t>(e / inner)];
      x = plus(x, times(T.data[static_cast<size_t>(at_t)], U.data[static_cast<size_t>(at_u)]));
      for (size_t p = all.size(); p-- > 0;) {
        at_t += step_t[p];
        at_u += step_u[p];
        if (++index[p] < n_.extent.at(all[p])) break;
        at_t -= step_t[p] * index[p];
        at_u -= step_u[p] * index[p];
        index[p] = 0;
      }
    }
    for (Mode m : T.modes) {
      holders_[m].erase(t);
      if (std::find(out.begin(), out.end(), m) != out.end()) holders_[m].insert(u);
    }
    for (Mode m : sums) {
      holders_.erase(m);
      n_.extent.erase(m);
      n_.labels.erase(m);
    }
    U.modes = out;
    U.data = std::move(data);
    alive_[static_cast<size_t>(t)] = 0;
    T.data.clear();
    T.data.shrink_to_fit();
  }

  bool absorb(SimplifyReport& r) {
    bool any = false;
    for (int t = 0; t < static_cast<int>(n_.tensors.size()); ++t) {
      if (!editable(t)) continue;
      const NetTensor& T = n_.tensors[static_cast<size_t>(t)];
      const std::int64_t size_t_ = static_cast<std::int64_t>(T.data.size());
      int best = -1;
      std::int64_t best_size = 0;
      if (T.modes.empty()) {  // a scalar: into the first other tensor that may change
        for (int u = 0; u < static_cast<int>(n_.tensors.size()) && best < 0; ++u)
          if (u != t && editable(u)) best = u;
      } else {
        std::set<int> neighbours;
        for (Mode m : T.modes)
          for (int u : holders_.at(m))
            if (u != t && editable(u)) neighbours.insert(u);
        for (int u : neighbours) {
          const std::int64_t s = n_.size_of(result_modes(t, u));
          if (s > std::max(size_t_, static_cast<std::int64_t>(n_.tensors[static_cast<size_t>(u)].data.size()))) continue;
          if (best < 0 || s < best_size) {
            best = u;
            best_size = s;
          }
        }
      }
      if (best < 0) continue;
      contract_into(t, best);
      ++r.absorbed;
      any = true;
    }
    return any;
  }

  // Tensor t as the matrix [legs in `rows` | the other legs], row-major.
  std::vector<cd> as_matrix(const NetTensor& T, const std::vector<Mode>& rows, const std::vector<Mode>& cols) const {
    const auto s = strides(T.modes);
    std::vector<Mode> order(rows);
    order.insert(order.end(), cols.begin(), cols.end());
    std::vector<std::int64_t> step;
    for (Mode m : order) step.push_back(s[static_cast<size_t>(std::find(T.modes.begin(), T.modes.end(), m) - T.modes.begin())]);
    return gather(T, order, step, 0);
  }

  // Splits a tensor in two through an SVD across the bipartition of its legs that makes the two
  // smallest, if they hold fewer values than it (quimb's split_simplify).
  bool split(SimplifyReport& r) {
    bool any = false;
    const int tensors = static_cast<int>(n_.tensors.size());  // not the halves made here
    for (int t = 0; t < tensors; ++t) {
      if (!editable(t)) continue;
      const NetTensor& T = n_.tensors[static_cast<size_t>(t)];
      const size_t k = T.modes.size();
      if (k < 2 || k > kMostLegsSplit || static_cast<std::int64_t>(T.data.size()) > kLargestSplit) continue;
      std::int64_t best_size = static_cast<std::int64_t>(T.data.size());
      std::vector<Mode> best_rows, best_cols;
      kernels::Svd best;
      std::int64_t best_rank = 0;
      for (std::uint32_t mask = 1; mask < (1u << (k - 1)); ++mask) {  // the last leg always with the columns
        std::vector<Mode> rows, cols;
        std::int64_t a = 1, b = 1;
        for (size_t p = 0; p < k; ++p) {
          const bool row = mask >> p & 1;
          (row ? rows : cols).push_back(T.modes[p]);
          (row ? a : b) *= n_.extent.at(T.modes[p]);
        }
        if (a + b >= best_size) continue;  // even rank 1 would not gain
        kernels::Svd d = kernels::svd(as_matrix(T, rows, cols).data(), a, b);
        std::int64_t rank = 0;
        while (rank < d.rank && d.s[static_cast<size_t>(rank)] > kSplitCutoff * d.s[0]) ++rank;
        if (rank == 0 || rank * (a + b) >= best_size) continue;
        best_size = rank * (a + b);
        best_rows = std::move(rows), best_cols = std::move(cols), best = std::move(d), best_rank = rank;
      }
      if (best_rank == 0) continue;
      // U S over rows + bond, Vh over bond + columns.
      const std::int64_t a = n_.size_of(best_rows), b = n_.size_of(best_cols), full = best.rank;
      const Mode bond = next_mode_++;
      n_.extent[bond] = best_rank;
      std::vector<cd> u(static_cast<size_t>(a * best_rank)), v(static_cast<size_t>(best_rank * b));
      for (std::int64_t i = 0; i < a; ++i)
        for (std::int64_t j = 0; j < best_rank; ++j)
          u[static_cast<size_t>(i * best_rank + j)] = best.u[static_cast<size_t>(i * full + j)] * best.s[static_cast<size_t>(j)];
      std::copy_n(best.vh.begin(), best_rank * b, v.begin());
      NetTensor second{best_cols, std::move(v), T.tag, -1};
      second.modes.insert(second.modes.begin(), bond);
      NetTensor& first = n_.tensors[static_cast<size_t>(t)];
      first.modes = best_rows;
      first.modes.push_back(bond);
      first.data = std::move(u);
      const int s2 = static_cast<int>(n_.tensors.size());
      n_.tensors.push_back(std::move(second));
      alive_.push_back(1);
      for (Mode m : best_cols) {
        holders_[m].erase(t);
        holders_[m].insert(s2);
      }
      holders_[bond] = {t, s2};
      ++r.split;
      any = true;
    }
    return any;
  }

  void compact() {
    std::vector<NetTensor> kept;
    for (size_t t = 0; t < n_.tensors.size(); ++t)
      if (alive_[t]) kept.push_back(std::move(n_.tensors[t]));
    n_.tensors = std::move(kept);
  }
};

}  // namespace

SimplifyReport simplify(Network& n, const SimplifyOptions& o) {
  n.validate("the network to simplify");
  SimplifyReport r = Simplifier(n, o).run();
  n.validate("the simplified network");
  return r;
}

}  // namespace qstage::tn
