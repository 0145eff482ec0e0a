#include "kernels/sci/sci_space_pairs.hpp"

#include <omp.h>

#include <algorithm>
#include <parallel/algorithm>
#include <bit>
#include <stdexcept>
#include <utility>

namespace qstage::kernels::sci {

namespace {


// Compressed rows from (row, value) pairs by counting (the order within a row does not matter):
// start gets rows + 1 entries. The pairs come in several lists (one per thread).
void compress(const std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>>& lists, std::size_t rows,
              std::vector<std::uint32_t>& start, std::vector<std::uint32_t>& out) {
  start.assign(rows + 1, 0);
  std::uint64_t total = 0;
  for (const auto& pairs : lists) {
    for (const auto& [row, value] : pairs) ++start[row + 1];
    total += pairs.size();
  }
  for (std::size_t r = 0; r < rows; ++r) start[r + 1] += start[r];
  std::vector<std::uint32_t> at(start.begin(), start.end() - 1);
  out.resize(total);
  for (const auto& pairs : lists)
    for (const auto& [row, value] : pairs) out[at[row]++] = value;
}

}  // namespace

// Two distinct strings `removed` electrons apart share exactly one string with `removed` of their
// electrons taken out (one apart share several with two taken out: the popcount test drops those).
// On OpenMP threads: keys, their sort (libstdc++'s parallel mode) and the runs of equal keys.
void SpacePairs::Strings::link(int removed, std::vector<std::uint32_t>& start, std::vector<std::uint32_t>& out) const {
  const std::size_t strings = value.size();
  const int n = strings ? popcount(value[0]) : 0;  // (every string of a space has as many electrons)
  const std::size_t per = removed == 1 ? static_cast<std::size_t>(n) : static_cast<std::size_t>(n) * (n - 1) / 2;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> keyed(strings * per);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(strings); ++i) {
    int occ[64];
    occupied(value[i], occ);
    auto* to = keyed.data() + static_cast<std::size_t>(i) * per;
    const auto id = static_cast<std::uint32_t>(i);
    if (removed == 1)
      for (int x = 0; x < n; ++x) *to++ = {value[i] & ~bit(occ[x]), id};
    else
      for (int x = 0; x < n; ++x)
        for (int y = x + 1; y < n; ++y) *to++ = {value[i] & ~bit(occ[x]) & ~bit(occ[y]), id};
  }
  __gnu_parallel::sort(keyed.begin(), keyed.end());
  std::vector<std::size_t> runs;  // where each run of equal keys starts
  for (std::size_t k = 0; k < keyed.size(); ++k)
    if (k == 0 || keyed[k].first != keyed[k - 1].first) runs.push_back(k);
  runs.push_back(keyed.size());
  const auto run_count = static_cast<std::int64_t>(runs.size()) - 1;
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> lists;
#pragma omp parallel
  {
#pragma omp single
    lists.resize(static_cast<std::size_t>(omp_get_num_threads()));
    // (a thread's own list, moved into `lists` at the end: the lists' headers side by side there
    // share cache lines, and every pair appended writes one)
    std::vector<std::pair<std::uint32_t, std::uint32_t>> pairs;
#pragma omp for schedule(dynamic, 256)
    for (std::int64_t r = 0; r < run_count; ++r)
      for (std::size_t x = runs[r]; x < runs[r + 1]; ++x)
        for (std::size_t y = runs[r]; y < runs[r + 1]; ++y) {
          const std::uint32_t u = keyed[x].second, v = keyed[y].second;
          if (u != v && popcount(value[u] ^ value[v]) == 2 * removed) pairs.emplace_back(u, v);
        }
    lists[static_cast<std::size_t>(omp_get_thread_num())] = std::move(pairs);
  }
  compress(lists, strings, start, out);
}

SpacePairs::SpacePairs(const Det* space, std::uint64_t n) : space_(space), n_(n) {
  det_alpha_.resize(n);
  det_beta_.resize(n);
  for (std::uint64_t j = 0; j < n; ++j) {
    if (j == 0 || space[j].alpha != space[j - 1].alpha) {
      alpha_first_.push_back(static_cast<std::uint32_t>(j));
      alpha_.value.push_back(space[j].alpha);
    }
    det_alpha_[j] = static_cast<std::uint32_t>(alpha_.value.size() - 1);
    beta_.value.push_back(space[j].beta);
  }
  alpha_first_.push_back(static_cast<std::uint32_t>(n));
  std::sort(beta_.value.begin(), beta_.value.end());
  beta_.value.erase(std::unique(beta_.value.begin(), beta_.value.end()), beta_.value.end());
  std::vector<std::pair<std::uint32_t, std::uint32_t>> by_beta(n);
  for (std::uint64_t j = 0; j < n; ++j) {
    det_beta_[j] = static_cast<std::uint32_t>(std::lower_bound(beta_.value.begin(), beta_.value.end(), space[j].beta) -
                                              beta_.value.begin());
    by_beta[j] = {det_beta_[j], static_cast<std::uint32_t>(j)};
  }
  compress({by_beta}, beta_.value.size(), by_beta_start_, by_beta_);
  for (Strings* s : {&alpha_, &beta_}) {
    s->link(1, s->singles_start, s->singles);
    s->link(2, s->doubles_start, s->doubles);
  }
}

std::uint64_t SpacePairs::find(std::uint32_t a, std::uint64_t beta) const {
  std::uint64_t lo = alpha_first_[a], hi = alpha_first_[a + 1];
  while (lo < hi) {
    const std::uint64_t mid = (lo + hi) / 2;
    if (space_[mid].beta < beta) lo = mid + 1;
    else hi = mid;
  }
  return lo < alpha_first_[a + 1] && space_[lo].beta == beta ? lo : n_;
}

// Each of the three kinds of partner is found by whichever is cheaper: scanning the determinants
// that share a string, or looking up each string near the other one (a binary search).
void SpacePairs::coupled(std::uint64_t j, std::vector<std::uint32_t>& out) const {
  const Det d = space_[j];
  const std::uint32_t a = det_alpha_[j], b = det_beta_[j];
  const auto push = [&](std::uint64_t i) {
    if (i < n_) out.push_back(static_cast<std::uint32_t>(i));
  };
  const auto cost_of_lookups = [](std::uint64_t lookups, std::uint64_t run) {
    return lookups * static_cast<std::uint64_t>(std::bit_width(run) + 1) * 4;  // (a search misses the cache; a scan streams)
  };
  const std::uint32_t a_singles = alpha_.singles_start[a + 1] - alpha_.singles_start[a];
  const std::uint32_t a_near = a_singles + alpha_.doubles_start[a + 1] - alpha_.doubles_start[a];
  const std::uint32_t b_singles = beta_.singles_start[b + 1] - beta_.singles_start[b];
  const std::uint32_t b_near = b_singles + beta_.doubles_start[b + 1] - beta_.doubles_start[b];

  // Same alpha string, beta one or two electrons away.
  const std::uint32_t run = alpha_first_[a + 1] - alpha_first_[a];
  if (run <= cost_of_lookups(b_near, run)) {
    for (std::uint32_t i = alpha_first_[a]; i < alpha_first_[a + 1]; ++i) {
      const int moved = popcount(space_[i].beta ^ d.beta);
      if (moved == 2 || moved == 4) out.push_back(i);
    }
  } else {
    for (std::uint32_t k = beta_.singles_start[b]; k < beta_.singles_start[b + 1]; ++k) push(find(a, beta_.value[beta_.singles[k]]));
    for (std::uint32_t k = beta_.doubles_start[b]; k < beta_.doubles_start[b + 1]; ++k) push(find(a, beta_.value[beta_.doubles[k]]));
  }
  // Same beta string, alpha one or two electrons away.
  const std::uint32_t shared_beta = by_beta_start_[b + 1] - by_beta_start_[b];
  if (shared_beta <= cost_of_lookups(a_near, 16)) {
    for (std::uint32_t k = by_beta_start_[b]; k < by_beta_start_[b + 1]; ++k) {
      const std::uint32_t i = by_beta_[k];
      const int moved = popcount(space_[i].alpha ^ d.alpha);
      if (moved == 2 || moved == 4) out.push_back(i);
    }
  } else {
    for (std::uint32_t k = alpha_.singles_start[a]; k < alpha_.singles_start[a + 1]; ++k) push(find(alpha_.singles[k], d.beta));
    for (std::uint32_t k = alpha_.doubles_start[a]; k < alpha_.doubles_start[a + 1]; ++k) push(find(alpha_.doubles[k], d.beta));
  }
  // One electron of each spin moved.
  for (std::uint32_t k = alpha_.singles_start[a]; k < alpha_.singles_start[a + 1]; ++k) {
    const std::uint32_t near = alpha_.singles[k], near_run = alpha_first_[near + 1] - alpha_first_[near];
    if (near_run <= cost_of_lookups(b_singles, near_run)) {
      for (std::uint32_t i = alpha_first_[near]; i < alpha_first_[near + 1]; ++i)
        if (popcount(space_[i].beta ^ d.beta) == 2) out.push_back(i);
    } else {
      for (std::uint32_t m = beta_.singles_start[b]; m < beta_.singles_start[b + 1]; ++m)
        push(find(near, beta_.value[beta_.singles[m]]));
    }
  }
}

ListOrder::ListOrder(const HamiltonianView& h) : norb_(h.norb) {
  const std::size_t n = static_cast<std::size_t>(h.norb), pairs = n * (n - 1) / 2;
  // (list_count is at most 2,080 for 64 orbitals: lists fit 16 bits, as entries do)
  if (h.single_width >= kListAbsent || h.opposite_width >= kListAbsent || h.same_width >= kListAbsent)
    throw std::invalid_argument("ListOrder: excitation lists longer than 65534 entries");
  single_.assign(n * n, kListAbsent);
  opposite_.assign(n * n * n * n, kListAbsent);
  same_.assign(pairs * pairs, kListAbsent);
  single_cut_.assign(n, 0);
  opposite_cut_.assign(n * n, 0);
  same_cut_.assign(pairs, 0);
  // Only the entries that for_each_excitation visits at eps = 0: those before the list's cut.
  for (int p = 0; p < h.norb; ++p) {
    const ListRef l{ListKind::single_alpha, p, 0};
    const std::uint32_t cut = single_cut_[p] = cut_length(h, l, 1.0, 0.0);
    for (std::uint32_t k = 0; k < cut; ++k) single_[p * n + h.single_target[list_slots(h, l).first + k]] = static_cast<std::uint16_t>(k);
  }
  for (int p = 0; p < h.norb; ++p)
    for (int q = 0; q < h.norb; ++q) {
      const ListRef l{ListKind::opposite, p, q};
      const ListSlots s = list_slots(h, l);
      const std::uint32_t cut = opposite_cut_[p * n + q] = cut_length(h, l, 1.0, 0.0);
      for (std::uint32_t k = 0; k < cut; ++k) {
        const int r = h.opposite_target[s.first + k] & 0xff, t = h.opposite_target[s.first + k] >> 8;
        opposite_[((p * n + q) * n + r) * n + t] = static_cast<std::uint16_t>(k);
      }
    }
  for (int q = 1; q < h.norb; ++q)
    for (int p = 0; p < q; ++p) {
      const ListRef l{ListKind::same_alpha, p, q};
      const ListSlots s = list_slots(h, l);
      const std::uint32_t cut = same_cut_[same_pair(p, q)] = cut_length(h, l, 1.0, 0.0);
      for (std::uint32_t k = 0; k < cut; ++k) {
        const int r = h.same_target[s.first + k] & 0xff, t = h.same_target[s.first + k] >> 8;
        same_[same_pair(p, q) * pairs + same_pair(std::min(r, t), std::max(r, t))] = static_cast<std::uint16_t>(k);
      }
    }
}

void ListOrder::list_starts(const Det& source, std::vector<std::uint32_t>& starts) const {
  int occ_a[64], occ_b[64];
  const int na = occupied(source.alpha, occ_a), nb = occupied(source.beta, occ_b);
  const std::size_t n = static_cast<std::size_t>(norb_);
  starts.clear();
  std::uint32_t at = 0;
  const auto next = [&](std::uint32_t length) { starts.push_back(at), at += length; };
  for (int i = 0; i < na; ++i) next(single_cut_[occ_a[i]]);
  for (int i = 0; i < nb; ++i) next(single_cut_[occ_b[i]]);
  for (int i = 0; i < na; ++i)
    for (int j = 0; j < nb; ++j) next(opposite_cut_[occ_a[i] * n + occ_b[j]]);
  for (int j = 1; j < na; ++j)
    for (int i = 0; i < j; ++i) next(same_cut_[same_pair(occ_a[i], occ_a[j])]);
  for (int j = 1; j < nb; ++j)
    for (int i = 0; i < j; ++i) next(same_cut_[same_pair(occ_b[i], occ_b[j])]);
  starts.push_back(at);
}

void lane_layout(const ListOrder& order, const Det* space, std::uint64_t n, const std::uint64_t* offsets,
                 const std::uint32_t* columns, const double* elements, const std::uint32_t* places, std::uint32_t lanes,
                 std::uint32_t* lane_ends, std::uint32_t* lane_columns, double* lane_elements) {
#pragma omp parallel
  {
    std::vector<std::uint32_t> starts, lane_of;
#pragma omp for schedule(dynamic, 64)
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(n); ++r) {
      order.list_starts(space[r], starts);
      const std::uint64_t first = offsets[r], count = offsets[r + 1] - first;
      std::uint32_t* ends = lane_ends + static_cast<std::uint64_t>(r) * lanes;
      std::fill(ends, ends + lanes, 0u);
      lane_of.resize(count);
      for (std::uint64_t k = 0; k < count; ++k) {
        const std::uint32_t place = places[first + k];
        lane_of[k] = (starts[place >> 16] + (place & 0xffff)) % lanes;
        ++ends[lane_of[k]];
      }
      for (std::uint32_t t = 1; t < lanes; ++t) ends[t] += ends[t - 1];
      // (a lane's entries keep their order: places ascend, and so do the virtual excitations)
      for (std::uint64_t k = count; k-- > 0;) {
        const std::uint64_t to = first + --ends[lane_of[k]];
        lane_columns[to] = columns[first + k];
        lane_elements[to] = elements[first + k];
      }
      for (std::uint32_t t = 0; t < lanes; ++t) ends[t] = 0;
      for (std::uint64_t k = 0; k < count; ++k) ++ends[lane_of[k]];
      for (std::uint32_t t = 1; t < lanes; ++t) ends[t] += ends[t - 1];
    }
  }
}

std::uint32_t ListOrder::key(const Det& source, const Det& target, int na, int nb) const {
  return list_key(view(), source, target, na, nb);
}

}  // namespace qstage::kernels::sci

namespace qstage::kernels::sci {

void CouplingRow::load(std::uint64_t j, const std::uint32_t* partners, std::size_t count) {
  d_ = space_[j];
  occupied(d_.alpha, occ_a_);
  occupied(d_.beta, occ_b_);
  keyed_.clear();
  for (std::size_t k = 0; k < count; ++k) {
    const std::uint32_t key = order_.key(d_, space_[partners[k]], na_, nb_);
    if (key != ListOrder::kNotListed) keyed_.push_back(std::uint64_t{key} << 32 | partners[k]);
  }
}

std::uint64_t CouplingRow::count() const {
  const auto singles = static_cast<std::uint64_t>(na_ + nb_);
  std::uint64_t count = 0;
  for (const std::uint64_t keyed : keyed_) {
    Det target;
    double element;
    count += (keyed >> 48) >= singles || entry(keyed, &target, &element);
  }
  return count;
}

bool CouplingRow::entry(std::uint64_t keyed, Det* target, double* element) const {
  const ListRef ref = list_at(static_cast<std::uint32_t>(keyed >> 48), na_, nb_, occ_a_, occ_b_);
  return list_entry(h_, d_, ref, static_cast<std::uint32_t>(keyed >> 32) & 0xffff, 1.0, 0.0, target, element);
}

CouplingsUpdate::CouplingsUpdate(const HamiltonianView& h, int na, int nb, const Det* previous,
                                 std::uint64_t previous_size, const Det* space, std::uint64_t size)
    : h_(h), na_(na), nb_(nb), space_(space), size_(size), order_(h) {
  // Which rows were there: previous and space are sorted, so one walk (previous must run out).
  old_index_.assign(size, -1);
  std::uint64_t i = 0;
  for (std::uint64_t j = 0; j < size && i < previous_size; ++j) {
    if (space[j] == previous[i]) old_index_[j] = static_cast<std::int64_t>(i++);
    else if (previous[i] < space[j]) break;  // previous[i] is not in space
  }
  if (i < previous_size) {
    contains_previous_ = false;
    return;
  }
  new_index_.resize(previous_size);
  for (std::uint64_t j = 0; j < size; ++j) {
    if (old_index_[j] >= 0) new_index_[static_cast<std::uint64_t>(old_index_[j])] = static_cast<std::uint32_t>(j);
    else old_index_[j] = -1 - static_cast<std::int64_t>(new_rows_.size()), new_rows_.push_back(static_cast<std::uint32_t>(j));
  }
  // The new rows' partners; each old partner gains the new row (coupling is symmetric).
  const SpacePairs pairs(space, size);
  std::vector<std::vector<std::uint32_t>> found(new_rows_.size());
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(new_rows_.size()); ++k) pairs.coupled(new_rows_[k], found[k]);
  partners_start_.assign(new_rows_.size() + 1, 0);
  gained_start_.assign(size + 1, 0);
  for (std::size_t k = 0; k < found.size(); ++k) {
    partners_start_[k + 1] = partners_start_[k] + static_cast<std::uint32_t>(found[k].size());
    for (const std::uint32_t p : found[k])
      if (old_index_[p] >= 0) ++gained_start_[p + 1];
  }
  for (std::uint64_t j = 0; j < size; ++j) gained_start_[j + 1] += gained_start_[j];
  partners_.resize(partners_start_.back());
  gained_.resize(gained_start_.back());
  std::vector<std::uint32_t> at(gained_start_.begin(), gained_start_.end() - 1);
  for (std::size_t k = 0; k < found.size(); ++k) {
    std::copy(found[k].begin(), found[k].end(), partners_.begin() + partners_start_[k]);
    for (const std::uint32_t p : found[k])
      if (old_index_[p] >= 0) gained_[at[p]++] = new_rows_[k];
  }
}

void CouplingsUpdate::count(const Stored& previous, std::uint64_t* counts) const {
  for_each_coupling_row(h_, na_, nb_, space_, order_, size_, [&](CouplingRow& row, std::uint64_t r) {
    const std::int64_t o = old_index_[r];
    if (o < 0) {
      const std::uint64_t k = static_cast<std::uint64_t>(-1 - o);
      row.load(r, partners_.data() + partners_start_[k], partners_start_[k + 1] - partners_start_[k]);
      counts[r] = row.count();
      return;
    }
    row.load(r, gained_.data() + gained_start_[r], gained_start_[r + 1] - gained_start_[r]);
    counts[r] = previous.offsets[o + 1] - previous.offsets[o] + row.count();
  });
}

void CouplingsUpdate::write(const Stored& previous, const std::uint64_t* offsets, std::uint32_t* columns, double* elements,
                            std::uint32_t* places, double* diagonal) const {
  for_each_coupling_row(h_, na_, nb_, space_, order_, size_, [&](CouplingRow& row, std::uint64_t r) {
    std::uint64_t at = offsets[r];
    const auto put = [&](std::uint32_t column, double element, std::uint32_t place) {
      columns[at] = column, elements[at] = element;
      if (places) places[at] = place;
      ++at;
    };
    const std::int64_t o = old_index_[r];
    if (o < 0) {
      const std::uint64_t k = static_cast<std::uint64_t>(-1 - o);
      row.load(r, partners_.data() + partners_start_[k], partners_start_[k + 1] - partners_start_[k]);
      row.visit(put);
      diagonal[r] = sci::diagonal(h_, space_[r]);
      return;
    }
    // The old entries (renumbered) and the gained ones, merged by place: both ascend.
    std::uint64_t kept = previous.offsets[o];
    const std::uint64_t kept_end = previous.offsets[o + 1];
    row.load(r, gained_.data() + gained_start_[r], gained_start_[r + 1] - gained_start_[r]);
    row.visit([&](std::uint32_t column, double element, std::uint32_t place) {
      for (; kept < kept_end && previous.places[kept] < place; ++kept)
        put(new_index_[previous.columns[kept]], previous.elements[kept], previous.places[kept]);
      put(column, element, place);
    });
    for (; kept < kept_end; ++kept) put(new_index_[previous.columns[kept]], previous.elements[kept], previous.places[kept]);
    diagonal[r] = previous.diagonal[o];
  });
}

}  // namespace qstage::kernels::sci
