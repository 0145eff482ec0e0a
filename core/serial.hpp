#pragma once
// Raw little-endian packing of values and vectors (bit for bit, NaN included): the binary state
// a step's run saves and loads (stages::StepRun), and what ranks send each other.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace qstage {

class Packer {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T>
  void put_vector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<std::uint64_t>(v.size());
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void put_string(std::string_view v) {
    put<std::uint64_t>(v.size());
    out_.append(v);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Unpacker {
 public:
  explicit Unpacker(std::string_view in) : in_(in) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    take(&v, sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> get_vector() {
    const auto n = get<std::uint64_t>();
    if (n > (in_.size() - at_) / std::max<std::size_t>(sizeof(T), 1)) throw std::runtime_error("packed state cut short");
    std::vector<T> v(n);
    take(v.data(), v.size() * sizeof(T));
    return v;
  }
  std::string get_string() {
    const auto n = get<std::uint64_t>();
    if (n > in_.size() - at_) throw std::runtime_error("packed state cut short");
    std::string v(n, '\0');
    take(v.data(), v.size());
    return v;
  }
  bool done() const { return at_ == in_.size(); }
  // Throws unless every byte was read (a state of another layout).
  void finish() const {
    if (!done()) throw std::runtime_error("packed state has bytes left over");
  }

 private:
  void take(void* dst, std::size_t bytes) {
    if (at_ + bytes > in_.size()) throw std::runtime_error("packed state cut short");
    if (bytes) std::memcpy(dst, in_.data() + at_, bytes);
    at_ += bytes;
  }
  std::string_view in_;  // (the caller keeps the bytes)
  std::size_t at_ = 0;
};

}  // namespace qstage
