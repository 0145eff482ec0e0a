#include "stages/mps/tebd.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include <omp.h>

#include "core/error.hpp"
#include "kernels/u1_math.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/linalg.hpp"

namespace qstage::stages::mps {

Truncation truncate(const std::vector<std::vector<double>>& values, const TruncParams& p) {
  struct Entry {
    double s;
    std::size_t block;
    std::size_t index;
  };
  std::vector<Entry> all;
  double total = 0;
  for (std::size_t b = 0; b < values.size(); ++b)
    for (std::size_t i = 0; i < values[b].size(); ++i) {
      all.push_back({values[b][i], b, i});
      total += values[b][i] * values[b][i];
    }
  std::sort(all.begin(), all.end(), [](const Entry& x, const Entry& y) {
    if (x.s != y.s) return x.s > y.s;
    if (x.block != y.block) return x.block < y.block;
    return x.index < y.index;
  });
  const double norm = std::sqrt(total);
  const auto n = static_cast<std::int64_t>(all.size());
  // Each constraint keeps a prefix of the ranking; apply the ones that leave at least one value.
  std::int64_t keep = n;
  auto constrain = [&](std::int64_t count) {
    if (std::min(keep, count) >= 1) keep = std::min(keep, count);
  };
  constrain(p.chi_max);
  if (p.svd_min > 0 && norm > 0) {
    std::int64_t c = 0;
    while (c < n && all[c].s / norm >= p.svd_min) ++c;
    constrain(c);
  }
  if (norm > 0) {
    // Keep position q while the summed squares from q to the end exceed trunc_cut^2.
    std::int64_t c = n;
    double tail = 0;
    while (c > 0 && tail + (all[c - 1].s / norm) * (all[c - 1].s / norm) <= p.trunc_cut * p.trunc_cut) {
      tail += (all[c - 1].s / norm) * (all[c - 1].s / norm);
      --c;
    }
    constrain(c);
  }
  Truncation t;
  t.kept.assign(values.size(), 0);
  for (std::int64_t q = 0; q < keep; ++q) ++t.kept[all[q].block];
  // eps summed directly rather than as 1 - kept: the difference would lose a small eps's digits.
  if (norm > 0) {
    double disc = 0;
    for (std::int64_t q = n - 1; q >= keep; --q) disc += (all[q].s / norm) * (all[q].s / norm);
    t.discarded = disc;
  }
  return t;
}

namespace {

// One new centre charge's block of Theta: rows the left sectors c_L in [c, c + d - 1], columns
// the right sectors c_R in [c - d + 1, c], both ascending; at `offset` in the flat C.
struct ChargeBlock {
  int charge = 0;
  std::vector<Sector> rows, cols;  // sectors of the outer bonds, with their offsets inside this block
  std::vector<std::int64_t> row0, col0;
  std::int64_t m = 0, n = 0, offset = 0;
};

// What one two-site update computes, planned on the host: the charge blocks of C(c) = gate (B B),
// the products of sector blocks that fill them (seed 001 eq. 16: the gate entry looked up by
// the charges) and where each site block sits in the packed input.
struct BondPlan {
  std::vector<ChargeBlock> blocks;
  std::vector<kernels::ChargeProduct> products;
  std::vector<kernels::ChargeScatter> scatters;
  std::vector<std::pair<const Block*, std::int64_t>> inputs;  // site blocks and their packed offsets
  std::int64_t input_size = 0, c_size = 0, scratch_size = 0;
};

// The charges c with lo <= c <= hi componentwise (n_pair: every key whose components lie between
// those of lo and hi), ascending.
std::vector<int> charges_between(const kernels::ChargeRule& rule, int lo, int hi) {
  std::vector<int> out;
  if (!rule.pair()) {
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    return out;
  }
  for (int a = kernels::pair_ket(lo); a <= kernels::pair_ket(hi); ++a)
    for (int b = kernels::pair_bra(lo); b <= kernels::pair_bra(hi); ++b) out.push_back(kernels::pair_key(a, b));
  return out;
}

BondPlan plan_bond(const U1Mps& psi, int j, const GateTable& gate) {
  const kernels::ChargeRule rule = psi.rule();
  const std::vector<Sector> ls = psi.bonds[j].sectors(), rs = psi.bonds[j + 2].sectors();
  const Site& a = psi.sites[j];
  const Site& b = psi.sites[j + 1];
  BondPlan plan;

  // The new centre charges: every c that some left sector can reach with a right sector.
  // (n_pair: the componentwise smallest right and largest left charges)
  int c_lo = rs.front().charge, c_hi = ls.back().charge;
  if (rule.pair()) {
    int ka = kernels::kPairMax, kb = kernels::kPairMax, ha = 0, hb = 0;
    for (const Sector& s : rs) ka = std::min(ka, kernels::pair_ket(s.charge)), kb = std::min(kb, kernels::pair_bra(s.charge));
    for (const Sector& s : ls) ha = std::max(ha, kernels::pair_ket(s.charge)), hb = std::max(hb, kernels::pair_bra(s.charge));
    c_lo = kernels::pair_key(ka, kb), c_hi = kernels::pair_key(ha, hb);
  }
  for (int c : charges_between(rule, c_lo, c_hi)) {
    ChargeBlock cb;
    cb.charge = c;
    for (const Sector& s : ls)
      if (rule.allowed(s.charge, c)) {
        cb.rows.push_back(s);
        cb.row0.push_back(cb.m);
        cb.m += s.size;
      }
    for (const Sector& s : rs)
      if (rule.allowed(c, s.charge)) {
        cb.cols.push_back(s);
        cb.col0.push_back(cb.n);
        cb.n += s.size;
      }
    if (cb.m == 0 || cb.n == 0) continue;
    cb.offset = plan.c_size;
    plan.c_size += cb.m * cb.n;
    plan.blocks.push_back(std::move(cb));
  }
  std::map<const Block*, std::int64_t> packed;
  auto input = [&](const Block* x) {
    auto [it, fresh] = packed.emplace(x, plan.input_size);
    if (fresh) {
      plan.inputs.emplace_back(x, plan.input_size);
      plan.input_size += x->rows * x->cols;
    }
    return it->second;
  };
  // Lookups by charge (n_pair bonds have hundreds of sectors: linear searches dominated planning).
  std::unordered_map<int, std::size_t> block_index;
  std::vector<std::unordered_map<int, std::size_t>> row_index(plan.blocks.size()), col_index(plan.blocks.size());
  for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
    block_index.emplace(plan.blocks[i].charge, i);
    for (std::size_t k = 0; k < plan.blocks[i].rows.size(); ++k) row_index[i].emplace(plan.blocks[i].rows[k].charge, k);
    for (std::size_t k = 0; k < plan.blocks[i].cols.size(); ++k) col_index[i].emplace(plan.blocks[i].cols[k].charge, k);
  }

  // P(c_L, c', c_R) = B[j](c_L, c') B[j+1](c', c_R), one product per old centre sector, each mixed
  // into the C(c) of every new centre charge by the gate entry its charges select.
  for (const Sector& l : ls)
    for (const Sector& r : rs) {
      if (!rule.two_site_allowed(l.charge, r.charge)) continue;
      const std::vector<int> centres = charges_between(rule, r.charge, l.charge);
      // The old centre sectors c' with a block (c_L, c') in B[j]: a's blocks are sorted by
      // (c_L, c'), so they are one run, in the ascending order of the centre bond's sectors.
      const auto first = std::lower_bound(a.blocks.begin(), a.blocks.end(), l.charge,
                                          [](const Block& blk, int c) { return blk.c_left < c; });
      for (auto it = first; it != a.blocks.end() && it->c_left == l.charge; ++it) {
        const Block* x = &*it;
        const Sector mid = psi.bonds[j + 1].sector(x->c_right);
        const Block* y = b.find(mid.charge, r.charge);
        if (!y) continue;
        kernels::ChargeProduct p{input(x), input(y), l.size, mid.size, r.size,
                                 static_cast<std::int64_t>(plan.scatters.size()), 0};
        for (int c : centres) {
          const cplx g = rule.gate_value(gate.u.data(), l.charge, mid.charge, c, r.charge);
          if (g == cplx{}) continue;
          const auto found = block_index.find(c);
          if (found == block_index.end()) continue;
          const ChargeBlock* cb = &plan.blocks[found->second];
          const std::size_t ri = row_index[found->second].at(l.charge), ci = col_index[found->second].at(r.charge);
          plan.scatters.push_back({cb->offset + cb->row0[ri] * cb->n + cb->col0[ci], cb->n, g});
          ++p.count;
        }
        if (p.count == 0) continue;
        plan.scratch_size = std::max(plan.scratch_size, p.m * p.n);
        plan.products.push_back(p);
      }
    }
  return plan;
}

// The lambda of each row of the flat C: diag(lambda[j]) C(c) is Theta(c).
std::vector<double> row_lambdas(const BondPlan& plan, const Bond& left, std::vector<kernels::ScaledRows>& matrices) {
  std::vector<double> scale;
  for (const ChargeBlock& cb : plan.blocks) {
    matrices.push_back({cb.offset, cb.m, cb.n, static_cast<std::int64_t>(scale.size())});
    for (const Sector& s : cb.rows) scale.insert(scale.end(), left.lambda.begin() + s.offset, left.lambda.begin() + s.offset + s.size);
  }
  return scale;
}

std::unique_ptr<Backend> host_backend() {
  return detail::make_cpu_backend(std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max());
}

double seconds_since(std::chrono::steady_clock::time_point& t) {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}

}  // namespace

double bond_expectation(const U1Mps& psi, int j, const GateTable& op) {
  GateTable identity;
  identity.d = psi.d;
  identity.u.assign(op.u.size(), cplx{});
  for (int n = 0; n < psi.d; ++n)
    for (int m = 0; m < psi.d; ++m) identity.u[kernels::gate_index(n, m, n, psi.d)] = 1.0;
  static const std::unique_ptr<Backend> host = host_backend();
  const std::unique_ptr<Stream> stream = host->make_stream();
  // Theta(c) of the identity and of op over the same blocks: <psi|op|psi> = sum conj(bra) ket.
  std::vector<std::vector<cplx>> theta;
  for (const GateTable* g : {static_cast<const GateTable*>(&identity), &op}) {
    const BondPlan plan = plan_bond(psi, j, *g);
    std::vector<cplx> in(plan.input_size), c(plan.c_size), scratch(plan.scratch_size), t(plan.c_size);
    for (const auto& [x, offset] : plan.inputs) std::copy(x->values.begin(), x->values.end(), in.begin() + offset);
    kernels::charge_products(*stream, in.data(), plan.products, plan.scatters, c.data(), plan.c_size, scratch.data());
    std::vector<kernels::ScaledRows> rows;
    const std::vector<double> scale = row_lambdas(plan, psi.bonds[j], rows);
    kernels::scale_rows(*stream, c.data(), scale.data(), rows, t.data());
    theta.push_back(std::move(t));
  }
  cplx sum{};
  for (std::size_t e = 0; e < theta[0].size(); ++e) sum += std::conj(theta[0][e]) * theta[1][e];
  return sum.real();
}

// Buffers that grow to the largest update: on the backend (device memory on cuda) and pinned
// staging on the host.
struct BondUpdater::Workspace {
  struct Grown {
    Buffer buffer;
    template <typename T>
    T* get(Backend& backend, std::int64_t count, bool device, const char* what) {
      const std::size_t bytes = std::max<std::size_t>(1, count * sizeof(T));
      if (buffer.size() < bytes) {
        buffer.reset();
        const std::size_t grown = bytes + bytes / 4;
        buffer = device ? backend.alloc_device(grown, what) : backend.alloc_host(grown, what);
      }
      return buffer.as<T>();
    }
  };
  Grown sites, c, theta, scale, s, vh, out, scratch, svd, host_in, host_scale, host_s, host_out;
};

BondUpdater::BondUpdater(Backend& backend, std::int64_t gpu_svd_from)
    : backend_(backend), stream_(backend.make_stream(true)), work_(std::make_unique<Workspace>()), gpu_svd_from_(gpu_svd_from) {}
BondUpdater::~BondUpdater() = default;

double BondUpdater::update(U1Mps& psi, int j, const GateTable& gate, const TruncParams& trunc) {
  Backend& be = backend_;
  Stream& st = *stream_;
  Workspace& w = *work_;
  auto clock = std::chrono::steady_clock::now();
  const BondPlan plan = plan_bond(psi, j, gate);

  // The two sites in, packed in the plan's order.
  cplx* host_in = w.host_in.get<cplx>(be, plan.input_size, false, "mps: staged site blocks");
  for (const auto& [x, offset] : plan.inputs) std::copy(x->values.begin(), x->values.end(), host_in + offset);
  cplx* sites = w.sites.get<cplx>(be, plan.input_size, true, "mps: site blocks");
  be.copy_to_device(sites, host_in, plan.input_size * sizeof(cplx), st);
  std::vector<kernels::ScaledRows> rows;
  const std::vector<double> lambdas = row_lambdas(plan, psi.bonds[j], rows);
  double* host_scale = w.host_scale.get<double>(be, static_cast<std::int64_t>(lambdas.size()), false, "mps: staged lambda");
  std::copy(lambdas.begin(), lambdas.end(), host_scale);
  double* scale = w.scale.get<double>(be, static_cast<std::int64_t>(lambdas.size()), true, "mps: lambda");
  be.copy_to_device(scale, host_scale, lambdas.size() * sizeof(double), st);
  st.synchronize();
  timings_.transfers += seconds_since(clock);

  // C(c) and Theta(c) = diag(lambda[j]) C(c).
  cplx* c = w.c.get<cplx>(be, plan.c_size, true, "mps: C blocks");
  cplx* theta = w.theta.get<cplx>(be, plan.c_size, true, "mps: Theta blocks");
  cplx* scratch = w.scratch.get<cplx>(be, plan.scratch_size, true, "mps: product scratch");
  kernels::charge_products(st, sites, plan.products, plan.scatters, c, plan.c_size, scratch);
  kernels::scale_rows(st, c, scale, rows, theta);
  st.synchronize();
  timings_.theta += seconds_since(clock);

  // One SVD per charge block.
  std::vector<kernels::SvdProblem> problems;
  std::int64_t s_size = 0, vh_size = 0;
  for (const ChargeBlock& cb : plan.blocks) {
    const std::int64_t r = std::min(cb.m, cb.n);
    problems.push_back({cb.m, cb.n, cb.offset, s_size, vh_size});
    s_size += r, vh_size += r * cb.n;
  }
  double* s = w.s.get<double>(be, s_size, true, "mps: singular values");
  cplx* vh = w.vh.get<cplx>(be, vh_size, true, "mps: right singular vectors");
  const std::size_t svd_bytes = kernels::svd_workspace_bytes(st, problems, gpu_svd_from_);
  void* svd_work = svd_bytes ? w.svd.get<char>(be, static_cast<std::int64_t>(svd_bytes), true, "mps: SVD workspace") : nullptr;
  timings_.svd_paths += kernels::batched_svd(st, theta, problems, s, vh, svd_work, svd_bytes, gpu_svd_from_);
  st.synchronize();
  timings_.svd += seconds_since(clock);

  // Global truncation on the host.
  double* host_s = w.host_s.get<double>(be, s_size, false, "mps: staged singular values");
  be.copy_to_host(host_s, s, s_size * sizeof(double), st);
  st.synchronize();
  std::vector<std::vector<double>> values;
  for (const auto& p : problems) values.emplace_back(host_s + p.s_offset, host_s + p.s_offset + std::min(p.m, p.n));
  const Truncation t = truncate(values, trunc);
  // The kept norm, in the units of the SVD (not relative): new lambda = S / that.
  double kept2 = 0;
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::int64_t q = 0; q < t.kept[i]; ++q) kept2 += values[i][q] * values[i][q];
  const double kept_norm = std::sqrt(kept2);
  last_norm_ = kept_norm;
  timings_.truncation += seconds_since(clock);

  // B'[j](c_L, c) = C(c) Y^dagger / kept_norm, Y the kept rows of Vh.
  std::vector<kernels::AdjointProduct> finish;
  std::int64_t out_size = 0;
  for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
    const ChargeBlock& cb = plan.blocks[i];
    if (t.kept[i] == 0) continue;
    finish.push_back({cb.offset, cb.m, cb.n, problems[i].vh_offset, t.kept[i], out_size, kept_norm});
    out_size += cb.m * t.kept[i];
  }
  cplx* out = w.out.get<cplx>(be, out_size, true, "mps: new left blocks");
  kernels::times_adjoint(st, c, vh, finish, out);
  st.synchronize();
  timings_.finish += seconds_since(clock);

  // Both new sites back: the left blocks, then each kept Y.
  std::int64_t y_size = 0;
  for (const auto& f : finish) y_size += f.k * f.n;
  cplx* host_out = w.host_out.get<cplx>(be, out_size + y_size, false, "mps: staged new blocks");
  be.copy_to_host(host_out, out, out_size * sizeof(cplx), st);
  std::int64_t y_at = out_size;
  std::vector<std::int64_t> y_offset;
  for (const auto& f : finish) {
    be.copy_to_host(host_out + y_at, vh + f.vh_offset, f.k * f.n * sizeof(cplx), st);
    y_offset.push_back(y_at);
    y_at += f.k * f.n;
  }
  st.synchronize();

  Bond new_centre;
  Site new_a, new_b;
  std::size_t f = 0;
  for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
    const ChargeBlock& cb = plan.blocks[i];
    const std::int64_t k = t.kept[i];
    if (k == 0) continue;
    for (std::int64_t q = 0; q < k; ++q) {
      new_centre.charges.push_back(cb.charge);
      new_centre.lambda.push_back(values[i][q] / kept_norm);
    }
    // B'[j+1](c, c_R) = the kept rows of Y, cut by right sector.
    const cplx* y = host_out + y_offset[f];
    for (std::size_t sct = 0; sct < cb.cols.size(); ++sct) {
      Block blk{cb.charge, cb.cols[sct].charge, k, cb.cols[sct].size, {}};
      blk.values.resize(static_cast<std::size_t>(k * blk.cols));
      for (std::int64_t q = 0; q < k; ++q) std::copy_n(&y[q * cb.n + cb.col0[sct]], blk.cols, &blk.values[q * blk.cols]);
      new_b.blocks.push_back(std::move(blk));
    }
    // B'[j](c_L, c), cut by left sector.
    const cplx* cy = host_out + finish[f].out_offset;
    for (std::size_t sct = 0; sct < cb.rows.size(); ++sct) {
      Block blk{cb.rows[sct].charge, cb.charge, cb.rows[sct].size, k, {}};
      blk.values.assign(cy + cb.row0[sct] * k, cy + (cb.row0[sct] + blk.rows) * k);
      new_a.blocks.push_back(std::move(blk));
    }
    ++f;
  }
  auto by_charges = [](const Block& x, const Block& y) {
    return std::pair{x.c_left, x.c_right} < std::pair{y.c_left, y.c_right};
  };
  std::sort(new_a.blocks.begin(), new_a.blocks.end(), by_charges);
  std::sort(new_b.blocks.begin(), new_b.blocks.end(), by_charges);
  psi.bonds[j + 1] = std::move(new_centre);
  psi.sites[j] = std::move(new_a);
  psi.sites[j + 1] = std::move(new_b);
  timings_.transfers += seconds_since(clock);
  ++timings_.updates;
  return t.discarded;
}

std::vector<std::int64_t> owned_updates(std::int64_t count, int rank, int ranks, int first) {
  std::vector<std::int64_t> mine;
  for (std::int64_t i = ((rank - first) % ranks + ranks) % ranks; i < count; i += ranks) mine.push_back(i);
  return mine;
}

LayerUpdater::LayerUpdater(Backend& backend, std::int64_t gpu_svd_from, RankExchange* ranks)
    : backend_(backend), gpu_svd_from_(gpu_svd_from), ranks_(ranks && ranks->size() > 1 ? ranks : nullptr),
      updaters_(static_cast<std::size_t>(std::max(1, omp_get_max_threads()))) {}
LayerUpdater::~LayerUpdater() = default;

void LayerUpdater::apply(U1Mps& psi, const std::vector<BondGate>& updates, const TruncParams& trunc, double& eps) {
  if (updates.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> discarded(updates.size(), 0.0), norms(updates.size(), 1.0);
  const int P = ranks_ ? ranks_->size() : 1;
  const std::vector<std::int64_t> mine = owned_updates(static_cast<std::int64_t>(updates.size()), ranks_ ? ranks_->rank() : 0,
                                                       P, static_cast<int>(exchange_.exchanges % P));
  const auto count = static_cast<std::int64_t>(mine.size());
  std::exception_ptr failure;
  std::mutex failure_mutex;
  // (an SVD's own OpenMP loop inside runs on its caller's thread: nested regions are inactive)
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
  for (std::int64_t k = 0; k < count; ++k) {
    const auto i = static_cast<std::size_t>(mine[static_cast<std::size_t>(k)]);
    try {
      auto& updater = updaters_[static_cast<std::size_t>(omp_get_thread_num())];
      if (!updater) {
        backend_.bind_thread();
        updater = std::make_unique<BondUpdater>(backend_, gpu_svd_from_);
      }
      discarded[i] = updater->update(psi, updates[i].bond, *updates[i].gate, trunc);
      norms[i] = updater->last_norm();
    } catch (...) {
      const std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  }
  if (ranks_) exchange(psi, updates, mine, failure, discarded, norms);
  else if (failure) std::rethrow_exception(failure);
  wall_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (double e : discarded) eps += e;
  if (psi.pair())
    for (double n : norms) psi.weight *= n;
}

void LayerUpdater::exchange(U1Mps& psi, const std::vector<BondGate>& updates, const std::vector<std::int64_t>& mine,
                            const std::exception_ptr& failure, std::vector<double>& discarded, std::vector<double>& norms) {
  const auto start = std::chrono::steady_clock::now();
  // A packet: a status byte (0: the updates follow; 1 InputError, 2 CheckFailed, 3 other: its message follows).
  Packer out;
  if (failure) {
    std::uint8_t kind = 3;
    std::string message = "unknown exception";
    try {
      std::rethrow_exception(failure);
    } catch (const InputError& e) {
      kind = 1, message = e.what();
    } catch (const CheckFailed& e) {
      kind = 2, message = e.what();
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    out.put(kind);
    out.put_string(message);
  } else {
    out.put(std::uint8_t{0});
    for (std::int64_t i : mine) {
      const int j = updates[static_cast<std::size_t>(i)].bond;
      out.put<std::uint64_t>(static_cast<std::uint64_t>(i));
      out.put(discarded[static_cast<std::size_t>(i)]), out.put(norms[static_cast<std::size_t>(i)]);
      out.put_bond(psi.bonds[j + 1]);
      out.put_site(psi.sites[j]), out.put_site(psi.sites[j + 1]);
      ++exchange_.bonds[j];
    }
  }
  const std::string packet = out.take();
  const std::vector<std::string> all = ranks_->allgather(packet);
  const int me = ranks_->rank(), P = ranks_->size(), first = static_cast<int>(exchange_.exchanges % P);
  if (all.size() != static_cast<std::size_t>(P)) throw std::logic_error("mps: the exchange returned a packet count other than the ranks'");
  // Every rank sees every packet, so every rank throws the same (the lowest failed rank's).
  for (int q = 0; q < P; ++q) {
    Unpacker in(all[static_cast<std::size_t>(q)]);
    const auto kind = in.get<std::uint8_t>();
    if (kind == 0) continue;
    const std::string message = in.get_string();
    if (kind == 1) throw InputError(message);
    if (kind == 2) throw CheckFailed(message);
    throw RuntimeFailure(fmt::format("mps: two-site update on rank {}: {}", q, message));
  }
  std::size_t received = mine.size();
  for (int q = 0; q < P; ++q) {
    const std::string& bytes = all[static_cast<std::size_t>(q)];
    exchange_.bytes_received += q == me ? 0 : bytes.size();
    if (q == me) continue;
    Unpacker in(bytes);
    in.get<std::uint8_t>();
    while (!in.done()) {
      const auto i = in.get<std::uint64_t>();
      if (i >= updates.size() || static_cast<int>((i + static_cast<std::uint64_t>(first)) % static_cast<std::uint64_t>(P)) != q)
        throw std::logic_error(fmt::format("mps: rank {} sent update {} of {}, which is not its own", q, i, updates.size()));
      const int j = updates[i].bond;
      discarded[i] = in.get<double>(), norms[i] = in.get<double>();
      psi.bonds[j + 1] = in.get_bond();
      psi.sites[j] = in.get_site();
      psi.sites[j + 1] = in.get_site();
      ++received;
    }
  }
  if (received != updates.size())
    throw std::logic_error(fmt::format("mps: the ranks exchanged {} of {} updates", received, updates.size()));
  exchange_.bytes_sent += packet.size();
  ++exchange_.exchanges;
  exchange_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

UpdateTimings LayerUpdater::timings() const {
  UpdateTimings t;
  for (const auto& u : updaters_)
    if (u) t += u->timings();
  return t;
}

double update_bond(U1Mps& psi, int j, const GateTable& gate, const TruncParams& trunc) {
  static const std::unique_ptr<Backend> host = host_backend();
  BondUpdater updater(*host);
  const double eps = updater.update(psi, j, gate, trunc);
  if (psi.pair()) psi.weight *= updater.last_norm();
  return eps;
}

}  // namespace qstage::stages::mps
