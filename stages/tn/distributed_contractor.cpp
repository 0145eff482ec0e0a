#include "stages/tn/distributed_contractor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <complex>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include "core/error.hpp"

namespace qstage::tn {

namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::vector<Mode>& v, Mode m) { return std::find(v.begin(), v.end(), m) != v.end(); }

std::vector<Mode> without(const std::vector<Mode>& v, const std::vector<Mode>& drop) {
  std::vector<Mode> out;
  for (Mode m : v)
    if (!contains(drop, m)) out.push_back(m);
  return out;
}

std::set<Mode> as_set(const std::vector<Mode>& v) { return {v.begin(), v.end()}; }

Transition transition_of(const std::string& name) {
  for (Transition t : {Transition::local, Transition::activate, Transition::keep, Transition::redistribute, Transition::gather})
    if (name == transition_name(t)) return t;
  throw InputError(fmt::format("the plan's distribution has a step with transition '{}'; expected local, activate, keep, "
                               "redistribute or gather (a plan file of another qstage version?)", name));
}

// The combos [begin, end) rank `rank` holds of a tensor sharded as `s` (every rank holds the one
// combo of a replicated tensor).
struct Range {
  std::int64_t begin = 0, end = 1;
  std::int64_t size() const { return end - begin; }
};
Range held_range(const Sharding& s, int rank, int ranks) {
  if (s.replicated()) return {0, 1};
  return {s.first(rank, ranks), s.first(rank + 1, ranks)};
}

}  // namespace

DistributedSchedule DistributedSchedule::from_json(const nlohmann::json& d) {
  DistributedSchedule s;
  s.ranks = d.at("ranks").get<int>();
  s.slot_bytes = d.value("slot_bytes", ~std::uint64_t{0});
  for (const auto& st : d.at("steps")) {
    s.transition.push_back(transition_of(st.at("transition").get<std::string>()));
    s.distributed.push_back(st.at("distributed_modes").get<std::vector<Mode>>());
  }
  s.gathered.assign(s.transition.size(), false);
  for (const auto& chain : d.at("chains")) {
    const auto steps = chain.get<std::vector<int>>();
    if (steps.empty() || steps.back() < 0 || static_cast<std::size_t>(steps.back()) >= s.gathered.size())
      throw InputError("the plan's distribution names a use-chain outside its steps; expected a plan file written by tn.plan");
    s.gathered[static_cast<std::size_t>(steps.back())] = true;
  }
  return s;
}

DistributedContractor::DistributedContractor(const Network& net, Plan plan, DistributedSchedule schedule, h5::DType dtype,
                                             kernels::Compute compute, comm::Communicator& comm)
    : net_(net), plan_(std::move(plan)), schedule_(std::move(schedule)), dtype_(dtype), comm_(comm),
      rank_(comm.rank()), ranks_(comm.size()) {
  if (schedule_.ranks != ranks_)
    throw InputError(fmt::format("the plan is distributed over {} ranks and this run has {}; expected mpirun -np {}, or "
                                 "a plan made with tn.plan's ranks: {}", schedule_.ranks, ranks_, schedule_.ranks, ranks_));
  if (schedule_.transition.size() != plan_.steps.size())
    throw InputError(fmt::format("the plan's distribution has {} steps and its plan {}; expected a plan file written by tn.plan",
                                 schedule_.transition.size(), plan_.steps.size()));
  if (plan_.steps.empty())
    throw InputError("the network is a single tensor: nothing to distribute; expected a plan without ranks");
  // The contractor only holds the inputs and runs single steps: no prologue or persistent region
  // of its own (this class keeps the invariant results itself).
  std::map<int, std::size_t> consumer;
  for (std::size_t s = 0; s < plan_.steps.size(); ++s) consumer[plan_.steps[s].a] = consumer[plan_.steps[s].b] = s;
  for (const PlanStep& st : plan_.steps) invariant_.push_back(st.invariant);
  for (const PlanStep& st : plan_.steps) {
    const auto reader = consumer.find(st.c);
    kept_.push_back(st.invariant && (reader == consumer.end() || !invariant_[reader->second]));  // (or the root)
  }
  local_.resize(plan_.steps.size());
  for (PlanStep& st : plan_.steps) st.invariant = st.a_persistent = st.b_persistent = st.c_persistent = false;
  plan_.invariant_steps = 0;
  plan_.persistent_bytes = 0;
  contractor_ = std::make_unique<Contractor>(net_, plan_, dtype, compute);
}

std::uint64_t DistributedContractor::BufferCache::rounded(std::uint64_t bytes) {
  std::uint64_t size = 256;
  while (size < bytes) size *= 2;
  return size;
}

Buffer DistributedContractor::BufferCache::take(Backend& backend, std::uint64_t bytes, const char* what) {
  const std::uint64_t size = rounded(bytes);
  auto it = free_.find(size);
  if (it == free_.end()) {
    auto alloc = [&] { return host_ ? backend.alloc_host(size, what) : backend.alloc_device(size, what); };
    try {
      return alloc();
    } catch (const BudgetExceeded&) {
      if (free_.empty()) throw;
      free_.clear();  // (buffers of other sizes, free but charged to the budget)
      return alloc();
    }
  }
  Buffer b = std::move(it->second);
  free_.erase(it);
  return b;
}

void DistributedContractor::BufferCache::give(Buffer buffer) {
  if (buffer.size()) free_.emplace(buffer.size(), std::move(buffer));
}

std::uint64_t DistributedContractor::BufferCache::bytes() const {
  std::uint64_t n = 0;
  for (const auto& [size, b] : free_) n += size;
  return n;
}

// On the device while the shard and room for four slots (an operand's, a result's on its way
// out, the all-to-all's send and receive) fit what the budget leaves; the cache's free buffers
// are let go first where that makes it fit.
Buffer DistributedContractor::hold(std::int64_t slots, std::uint64_t slot, bool may_spill, const char* what, bool& on_host) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(slots, 0)) * slot;
  on_host = false;
  if (may_spill && schedule_.slot_bytes != ~std::uint64_t{0}) {
    const MemoryBudget& b = backend_->device_budget();
    const std::uint64_t need = BufferCache::rounded(bytes) + 4 * BufferCache::rounded(slot), used = b.in_use();
    auto fits = [&](std::uint64_t in_use) { return in_use <= b.limit() && need <= b.limit() - in_use; };
    if (!fits(used) && fits(used - std::min(used, cache_.bytes()))) cache_.clear();
    if (!fits(b.in_use())) {
      on_host = true;
      return host_cache_.take(*backend_, bytes, what);
    }
  }
  return cache_.take(*backend_, bytes, what);
}

void DistributedContractor::release(Held& t, Stream& stream) {
  if (!t.on_host) return cache_.give(std::move(t.buffer));  // (later launches on the stream may reuse it)
  stream.synchronize();  // (copies from or into it may still be queued, and the cache may free it)
  host_cache_.give(std::move(t.buffer));
}

// Grows `buffer` (through the cache) to at least `bytes`.
void DistributedContractor::ensure(Buffer& buffer, std::uint64_t bytes, const char* what) {
  if (buffer.size() >= bytes) return;
  cache_.give(std::move(buffer));
  buffer = cache_.take(*backend_, bytes, what);
}

void DistributedContractor::upload(Backend& backend, Stream& stream) {
  backend_ = &backend;
  contractor_->upload(backend, stream);
}

std::uint64_t DistributedContractor::bytes_of(const std::vector<Mode>& modes) const {
  return static_cast<std::uint64_t>(net_.size_of(modes)) * element_bytes();
}

// The value of each of s's modes in combo `combo` (row-major: the last mode fastest).
std::map<Mode, std::int64_t> DistributedContractor::values_of(const Sharding& s, std::int64_t combo) const {
  std::map<Mode, std::int64_t> v;
  for (std::size_t j = s.modes.size(); j-- > 0;) {
    const std::int64_t extent = net_.extent.at(s.modes[j]);
    v[s.modes[j]] = combo % extent;
    combo /= extent;
  }
  return v;
}

Sharding DistributedContractor::sharded_over(const std::vector<Mode>& modes) const {
  Sharding s;
  s.modes = modes;
  for (Mode m : modes) s.combos *= net_.extent.at(m);
  return s;  // (fewer combos than ranks: some ranks hold none)
}

// The operand `t` of combo `combo` of the sharding `s` the step computes in: its slot if it is
// sharded (as s), else the replicated tensor with s's modes that it carries fixed to the combo's
// values - where they lead its layout, the block that starts there; else gathered into `scratch`.
const char* DistributedContractor::operand_for(Stream& stream, const Held& t, const Sharding& s, std::int64_t combo,
                                               Buffer& scratch) {
  const std::uint64_t e = element_bytes();
  if (!t.sharding.replicated()) {
    if (t.sharding.modes != s.modes) throw std::logic_error("tn: a step's distributed operand is sharded over other modes");
    const Range r = held_range(t.sharding, rank_, ranks_);
    const std::uint64_t slot = bytes_of(without(t.layout, t.sharding.modes));
    const char* at = t.data + static_cast<std::uint64_t>(combo - r.begin) * slot;
    if (!t.on_host) return at;
    ensure(scratch, slot, "tn: distributed operand's slot (out of core)");  // (in stream order after its last reader)
    backend_->copy_to_device(scratch.data(), at, slot, stream);
    return static_cast<const char*>(scratch.data());
  }
  const std::map<Mode, std::int64_t> value = values_of(s, combo);
  std::int64_t base = 0;
  std::size_t fixed = 0;
  bool leading = true;
  for (std::size_t i = 0; i < t.layout.size(); ++i) {
    const auto it = value.find(t.layout[i]);
    if (it == value.end()) continue;
    base += it->second * stride_in(net_, t.layout, t.layout[i]);
    leading = leading && i == fixed;
    ++fixed;
  }
  if (fixed == 0) return t.data;
  if (leading) return t.data + static_cast<std::uint64_t>(base) * e;
  const std::vector<Mode> rest = without(t.layout, s.modes);
  ensure(scratch, bytes_of(rest), "tn: distributed operand's block");
  contractor_->relayout(stream, t.layout, t.data + static_cast<std::uint64_t>(base) * e, rest, static_cast<char*>(scratch.data()));
  return static_cast<const char*>(scratch.data());
}

// Reshards `from` as `to` (the new modes lead the layout once the old ones are left out, or
// there are none: a gather). One all-to-all per round; round t gives each rank its t-th combo.
DistributedContractor::Held DistributedContractor::reshard(Stream& stream, Held from, const Sharding& to, std::uint64_t& sent) {
  const std::uint64_t e = element_bytes();
  const Sharding& old = from.sharding;
  const std::vector<Mode> local = without(from.layout, old.modes);   // an old slot's layout
  const std::vector<Mode> fresh = without(to.modes, old.modes);      // new modes an old slot still has
  if (!std::equal(fresh.begin(), fresh.end(), local.begin()))
    throw std::logic_error("tn: the modes a tensor is resharded over do not lead its layout");
  const std::vector<Mode> kept = without(local, to.modes);           // a block's layout
  const std::vector<Mode> spread = without(old.modes, to.modes);     // old modes that the new slots hold
  const std::uint64_t block = bytes_of(kept), old_slot = bytes_of(local);
  const std::vector<Mode> slot_layout = without(from.layout, to.modes);
  const std::uint64_t new_slot = bytes_of(slot_layout);
  // Whether old combo o holds part of new combo n: the modes in both have the same values.
  auto overlaps = [&](std::int64_t o, std::int64_t n) {
    const auto a = values_of(old, o), b = values_of(to, n);
    for (const auto& [m, v] : a)
      if (b.count(m) && b.at(m) != v) return false;
    return true;
  };
  // Where new combo n's block starts in an old slot: its fresh modes' values.
  auto block_offset = [&](std::int64_t n) {
    const auto v = values_of(to, n);
    std::int64_t at = 0;
    for (Mode m : fresh) at += v.at(m) * stride_in(net_, local, m);
    return static_cast<std::uint64_t>(at) * e;
  };
  Held out;
  out.layout = from.layout;
  out.sharding = to;
  const Range mine_old = held_range(old, rank_, ranks_), mine_new = held_range(to, rank_, ranks_);
  out.buffer = hold(mine_new.size(), new_slot, !to.replicated(), "tn: distributed intermediate (shard)", out.on_host);
  out.data = static_cast<const char*>(out.buffer.data());
  std::int64_t rounds = 0;
  for (int r = 0; r < ranks_; ++r) rounds = std::max(rounds, held_range(to, r, ranks_).size());
  std::int64_t received_blocks = 1;
  for (Mode m : spread) received_blocks *= net_.extent.at(m);
  for (std::int64_t round = 0; round < rounds; ++round) {
    comm::Counts send_counts(static_cast<std::size_t>(ranks_), 0), recv_counts(static_cast<std::size_t>(ranks_), 0);
    std::vector<std::pair<const char*, std::uint64_t>> pieces;  // (source, bytes) in send order
    for (int s = 0; s < ranks_; ++s) {
      const Range theirs = held_range(to, s, ranks_);
      if (round >= theirs.size()) continue;
      const std::int64_t n = theirs.begin + round;
      for (std::int64_t o = mine_old.begin; o < mine_old.end; ++o)
        if (overlaps(o, n)) {
          pieces.push_back({from.data + static_cast<std::uint64_t>(o - mine_old.begin) * old_slot + block_offset(n), block});
          send_counts[static_cast<std::size_t>(s)] += block;
        }
    }
    const bool receives = round < mine_new.size();
    const std::int64_t n = mine_new.begin + round;
    for (int r = 0; receives && r < ranks_; ++r) {
      const Range theirs = held_range(old, r, ranks_);
      for (std::int64_t o = theirs.begin; o < theirs.end; ++o)
        if (overlaps(o, n)) recv_counts[static_cast<std::size_t>(r)] += block;
    }
    std::uint64_t send_total = 0, recv_total = 0;
    for (int r = 0; r < ranks_; ++r) send_total += send_counts[static_cast<std::size_t>(r)], recv_total += recv_counts[static_cast<std::size_t>(r)];
    if (receives && recv_total != static_cast<std::uint64_t>(received_blocks) * block)
      throw std::logic_error("tn: a resharded slot does not receive all of its blocks");
    spdlog::debug("tn: reshard over [{}] -> [{}], round {}: {} B sent, {} B received, slots of {} -> {} B{}", fmt::join(old.modes, ","),
                  fmt::join(to.modes, ","), round, send_total, recv_total, old_slot, new_slot, out.on_host ? " (host)" : "");
    Buffer send = cache_.take(*backend_, send_total, "tn: all-to-all send buffer");
    Buffer recv = cache_.take(*backend_, recv_total, "tn: all-to-all receive buffer");
    std::uint64_t at = 0;
    for (const auto& [src, bytes] : pieces) {
      if (from.on_host) backend_->copy_to_device(static_cast<char*>(send.data()) + at, src, bytes, stream);
      else backend_->copy_on_device(static_cast<char*>(send.data()) + at, src, bytes, stream);
      at += bytes;
    }
    comm_.alltoallv(comm::DeviceSpan<const std::uint8_t>(send.as<const std::uint8_t>(), send_total), send_counts,
                    comm::DeviceSpan<std::uint8_t>(recv.as<std::uint8_t>(), recv_total), recv_counts, stream);
    sent += send_total - send_counts[static_cast<std::size_t>(rank_)];
    if (receives) {
      // The received blocks, in sender order, are [spread (old order) | kept]: gather the slot.
      std::vector<Mode> received = spread;
      received.insert(received.end(), kept.begin(), kept.end());
      char* slot = static_cast<char*>(out.buffer.data()) + static_cast<std::uint64_t>(round) * new_slot;
      if (out.on_host) ensure(stage_, new_slot, "tn: distributed slot on its way to host memory (out of core)");
      contractor_->relayout(stream, received, static_cast<const char*>(recv.data()), slot_layout,
                            out.on_host ? static_cast<char*>(stage_.data()) : slot);
      if (out.on_host) backend_->copy_to_host(slot, stage_.data(), new_slot, stream);
    }
    cache_.give(std::move(send));  // (later work on the stream may reuse them: it runs after this)
    cache_.give(std::move(recv));
  }
  release(from, stream);
  return out;
}

std::vector<cd> DistributedContractor::contract(Stream& stream, std::uint64_t slice, const std::vector<std::uint8_t>& bits,
                                                StepTimes* times) {
  const std::uint64_t e = element_bytes();
  const std::size_t N = net_.tensors.size();
  if (times) {
    times->compute.assign(plan_.steps.size(), 0.0);
    times->comm.assign(plan_.steps.size(), 0.0);
    times->sent_bytes.assign(plan_.steps.size(), 0);
    times->on_host.assign(plan_.steps.size(), 0);
  }
  // The invariant steps' kept results serve every slice of the same bitstring.
  const bool reuse = kept_bits_ && *kept_bits_ == bits;
  if (!reuse) {
    for (auto& [id, held] : kept_results_) release(held, stream);
    kept_results_.clear();
    kept_bits_.reset();
  }
  std::map<int, Held> made;  // intermediates not yet read
  auto take = [&](int id) {
    if (static_cast<std::size_t>(id) < N) {
      Held in;
      in.data = contractor_->input(id, slice, bits);
      in.layout = plan_.input_layouts[static_cast<std::size_t>(id)];
      return in;
    }
    if (const auto kept = kept_results_.find(id); kept != kept_results_.end()) {
      Held view;  // (without its buffer: it stays kept)
      view.data = kept->second.data;
      view.layout = kept->second.layout;
      view.sharding = kept->second.sharding;
      view.on_host = kept->second.on_host;
      return view;
    }
    auto it = made.find(id);
    if (it == made.end()) throw std::logic_error("tn: a distributed step reads a tensor no step made");
    Held h = std::move(it->second);
    made.erase(it);
    return h;
  };
  for (std::size_t s = 0; s < plan_.steps.size(); ++s) {
    const PlanStep& st = plan_.steps[s];
    const Transition tr = schedule_.transition[s];
    if (reuse && invariant_[s]) continue;
    const auto t0 = Clock::now();
    Held a = take(st.a), b = take(st.b);
    Sharding in;  // the sharding this step computes in
    if (tr == Transition::activate) {
      in = sharded_over(leading_prefix(net_, st.c_modes, ranks_, slot_elements(schedule_.slot_bytes, e)));
    } else if (tr != Transition::local) {  // (a chain activated over no modes, a scalar's, stays replicated)
      if (!a.sharding.replicated() && !b.sharding.replicated())
        throw std::logic_error("tn: a chain step reads two distributed operands");
      in = a.sharding.replicated() ? b.sharding : a.sharding;
    }
    if ((tr == Transition::local || tr == Transition::activate) && !(a.sharding.replicated() && b.sharding.replicated()))
      throw std::logic_error("tn: a step outside a chain, or a chain's first, reads a distributed operand");
    if (tr != Transition::redistribute && as_set(in.modes) != as_set(schedule_.distributed[s]))
      throw InputError(fmt::format("the plan's step {} distributes modes other than its layout gives; expected a plan file "
                                   "written by tn.plan", s));
    Held c;
    c.layout = st.c_modes;
    c.sharding = in;
    const Range mine = held_range(in, rank_, ranks_);
    const std::uint64_t slot = bytes_of(without(st.c_modes, in.modes));
    c.buffer = hold(mine.size(), slot, !in.replicated(), in.replicated() ? "tn: intermediate" : "tn: distributed intermediate (shard)",
                    c.on_host);
    c.data = static_cast<const char*>(c.buffer.data());
    if (c.on_host) ensure(stage_, slot, "tn: distributed slot on its way to host memory (out of core)");
    if (!local_[s]) {
      std::uint64_t workspace_bytes = 0;
      PlanStep view = local_step(net_, st, in.modes, e, workspace_bytes);
      local_[s].emplace(std::move(view), workspace_bytes);
    }
    const PlanStep& step = local_[s]->first;
    ensure(workspace_, local_[s]->second, "tn: packing workspace");
    ensure(staging_, contractor_->staging_for(local_[s]->first), "tn: reduced-precision staging");
    for (std::int64_t k = mine.begin; k < mine.end; ++k) {
      char* at = static_cast<char*>(c.buffer.data()) + static_cast<std::uint64_t>(k - mine.begin) * slot;
      contractor_->run_local_step(stream, step, operand_for(stream, a, in, k, scratch_a_), operand_for(stream, b, in, k, scratch_b_),
                                  c.on_host ? static_cast<char*>(stage_.data()) : at, static_cast<char*>(workspace_.data()),
                                  static_cast<char*>(staging_.data()));
      if (c.on_host) backend_->copy_to_host(at, stage_.data(), slot, stream);
    }
    release(a, stream);
    release(b, stream);
    if (times) stream.synchronize();
    const auto t1 = Clock::now();
    std::uint64_t sent = 0;
    if (tr == Transition::redistribute) {
      c = reshard(stream, std::move(c), sharded_over(leading_prefix(net_, st.c_modes, ranks_, slot_elements(schedule_.slot_bytes, e))), sent);
      if (as_set(c.sharding.modes) != as_set(schedule_.distributed[s]))
        throw InputError(fmt::format("the plan's step {} redistributes over modes other than its layout gives; expected a "
                                     "plan file written by tn.plan", s));
    }
    if (schedule_.gathered[s] && !c.sharding.replicated()) c = reshard(stream, std::move(c), Sharding{}, sent);
    if (times) {
      stream.synchronize();
      const auto t2 = Clock::now();
      times->compute[s] = std::chrono::duration<double>(t1 - t0).count();
      times->comm[s] = std::chrono::duration<double>(t2 - t1).count();
      times->sent_bytes[s] = sent;
      times->on_host[s] = c.on_host;
    }
    if (kept_[s]) kept_results_[st.c] = std::move(c);
    else made[st.c] = std::move(c);
  }
  kept_bits_ = bits;
  Held root = take(plan_.steps.back().c);
  if (!root.sharding.replicated()) throw std::logic_error("tn: the distributed contraction's result was not gathered");
  std::vector<char> host(result_elements() * e);
  backend_->copy_to_host(host.data(), root.data, host.size(), stream);
  stream.synchronize();
  release(root, stream);
  std::vector<cd> value(result_elements());
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (e == 16) {
      std::memcpy(&value[i], host.data() + i * 16, 16);
    } else {
      std::complex<float> f;
      std::memcpy(&f, host.data() + i * 8, 8);
      value[i] = f;
    }
  }
  return value;
}

}  // namespace qstage::tn
