#include "backend/memory_pool.hpp"

#include <algorithm>

namespace qstage::detail {

// ------------------------------------------------------------------------------ MemoryPool

struct MemoryPool::State {
  MemoryBudget* budget = nullptr;
  Allocate allocate;
  std::function<void()> quiesce;
  std::mutex mutex;
  std::multimap<std::size_t, Block> idle;  // by size
  bool given_back_since_quiesce = false;
  PoolCounters counters;
  ~State() {
    for (auto& [bytes, block] : idle) budget->idle_to_none(bytes);
  }
};

MemoryPool::MemoryPool(MemoryBudget& budget, Allocate allocate, std::function<void()> quiesce)
    : state_(std::make_shared<State>()) {
  state_->budget = &budget;
  state_->allocate = std::move(allocate);
  state_->quiesce = std::move(quiesce);
}

MemoryPool::~MemoryPool() { release_idle(); }

Buffer MemoryPool::take(std::size_t bytes, std::string_view what) {
  std::unique_lock lock(state_->mutex);
  State& s = *state_;
  s.counters.taken += 1;
  std::shared_ptr<Buffer> memory;
  // Only a block of exactly that size: a larger one would be charged whole, and a pass planned to
  // fill its budget to the byte would then not fit (the engine sizes its buffers by size class,
  // so passes of about the same size ask for the same bytes).
  if (auto it = s.idle.find(bytes); it != s.idle.end()) {
    memory = std::move(it->second.memory);
    s.idle.erase(it);
    s.budget->idle_to_use(memory->size());
    s.counters.reused += 1;
    if (s.given_back_since_quiesce && s.quiesce) s.quiesce();
    s.given_back_since_quiesce = false;
  } else {
    free_idle_until_fits(bytes);
    s.budget->charge(bytes, what);
    try {
      memory = std::make_shared<Buffer>(s.allocate(bytes, what));
    } catch (...) {
      s.budget->release(bytes);
      throw;
    }
  }
  std::weak_ptr<State> owner = state_;
  return Buffer(memory->data(), bytes, nullptr, [owner, memory](void*) mutable {
    if (auto pool = owner.lock()) {
      std::lock_guard guard(pool->mutex);
      const std::size_t held = memory->size();
      pool->budget->use_to_idle(held);
      pool->idle.emplace(held, Block{std::move(memory)});
      pool->given_back_since_quiesce = true;
    } else {  // the pool went with its backend (and its budget): back to the driver
      memory.reset();
    }
  });
}

void MemoryPool::make_room(std::size_t bytes) {
  std::lock_guard lock(state_->mutex);
  free_idle_until_fits(bytes);
}

void MemoryPool::free_idle_until_fits(std::size_t bytes) {
  State& s = *state_;
  while (!s.idle.empty() && s.budget->in_use() + s.budget->idle() + bytes > s.budget->limit())
    free_block(std::prev(s.idle.end()));  // the largest first
}

void MemoryPool::free_block(std::multimap<std::size_t, Block>::iterator it) {
  State& s = *state_;
  s.budget->idle_to_none(it->first);
  s.idle.erase(it);  // (its Buffer frees the memory)
}

void MemoryPool::release_idle() {
  std::lock_guard lock(state_->mutex);
  while (!state_->idle.empty()) free_block(state_->idle.begin());
}

PoolCounters MemoryPool::counters() const {
  std::lock_guard lock(state_->mutex);
  return state_->counters;
}

// ------------------------------------------------------------------------------ StreamPool

struct StreamPool::State {
  Make make;
  Hook lend, keep;
  std::mutex mutex;
  struct Idle {
    std::unique_ptr<Stream> stream;
    bool with_blas = false;
  };
  std::vector<Idle> idle;
};

namespace {

// A pooled stream as its user sees it: the stream itself, given back when the user lets go.
class PooledStream final : public Stream {
 public:
  PooledStream(std::unique_ptr<Stream> inner, bool with_blas, std::function<void(std::unique_ptr<Stream>, bool)> give_back)
      : inner_(std::move(inner)), with_blas_(with_blas), give_back_(std::move(give_back)) {}
  ~PooledStream() override { give_back_(std::move(inner_), with_blas_); }
  BackendKind kind() const override { return inner_->kind(); }
  void synchronize() override { inner_->synchronize(); }
  bool ready() override { return inner_->ready(); }
  void mark(int i) override { inner_->mark(i); }
  double seconds_between(int from, int to) override { return inner_->seconds_between(from, to); }
  Point record() override { return inner_->record(); }
  void wait(const Point& point) override { inner_->wait(point); }
  void* native() override { return inner_->native(); }
  void* blas_handle() override { return inner_->blas_handle(); }

 private:
  std::unique_ptr<Stream> inner_;
  bool with_blas_;
  std::function<void(std::unique_ptr<Stream>, bool)> give_back_;
};

}  // namespace

StreamPool::StreamPool(Make make, Hook lend, Hook keep) : state_(std::make_shared<State>()) {
  state_->make = std::move(make);
  state_->lend = std::move(lend);
  state_->keep = std::move(keep);
}

StreamPool::~StreamPool() { release_idle(); }

std::unique_ptr<Stream> StreamPool::take(bool with_blas) {
  std::unique_ptr<Stream> inner;
  {
    std::lock_guard lock(state_->mutex);
    auto& idle = state_->idle;
    auto it = std::find_if(idle.begin(), idle.end(), [&](const State::Idle& i) { return i.with_blas == with_blas; });
    if (it != idle.end()) {
      inner = std::move(it->stream);
      idle.erase(it);
    }
  }
  if (!inner) inner = state_->make(with_blas);
  if (state_->lend) state_->lend(*inner, with_blas);
  std::weak_ptr<State> owner = state_;
  return std::make_unique<PooledStream>(std::move(inner), with_blas,
                                        [owner](std::unique_ptr<Stream> s, bool blas) {
                                          if (auto pool = owner.lock()) {
                                            if (pool->keep) pool->keep(*s, blas);
                                            std::lock_guard lock(pool->mutex);
                                            pool->idle.push_back({std::move(s), blas});
                                          }  // (else the stream goes with it)
                                        });
}

void StreamPool::release_idle() {
  std::vector<State::Idle> gone;
  std::lock_guard lock(state_->mutex);
  gone.swap(state_->idle);
}

}  // namespace qstage::detail
