#pragma once
// compute() runs on rank 0 and hands write_results one string: the MPS stages pack their state
// and measurements into it as raw little-endian values (bit for bit, NaN included). mps.tebd's
// ranks exchange the sites they updated the same way (LayerUpdater).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

class Packer {
 public:
  template <class T>
  void put(const T& v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T>
  void put_vector(const std::vector<T>& v) {
    put<std::uint64_t>(v.size());
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void put_mps(const U1Mps& psi) {
    put(psi.L), put(psi.d), put(psi.total_charge), put(static_cast<int>(psi.kind)), put(psi.weight);
    for (const Bond& b : psi.bonds) put_bond(b);
    for (const Site& s : psi.sites) put_site(s);
  }
  void put_bond(const Bond& b) { put_vector(b.charges), put_vector(b.lambda); }
  void put_site(const Site& s) {
    put<std::uint64_t>(s.blocks.size());
    for (const Block& b : s.blocks) put(b.c_left), put(b.c_right), put(b.rows), put(b.cols), put_vector(b.values);
  }
  void put_string(const std::string& v) {
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
    T v;
    take(&v, sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> get_vector() {
    std::vector<T> v(get<std::uint64_t>());
    take(v.data(), v.size() * sizeof(T));
    return v;
  }
  U1Mps get_mps() {
    U1Mps psi;
    psi.L = get<int>(), psi.d = get<int>(), psi.total_charge = get<int>();
    psi.kind = static_cast<kernels::ChargeKind>(get<int>()), psi.weight = get<double>();
    psi.bonds.resize(psi.L + 1);
    psi.sites.resize(psi.L);
    for (Bond& b : psi.bonds) b = get_bond();
    for (Site& s : psi.sites) s = get_site();
    return psi;
  }
  Bond get_bond() {
    Bond b;
    b.charges = get_vector<int>(), b.lambda = get_vector<double>();
    return b;
  }
  Site get_site() {
    Site s;
    s.blocks.resize(get<std::uint64_t>());
    for (Block& b : s.blocks) {
      b.c_left = get<int>(), b.c_right = get<int>();
      b.rows = get<std::int64_t>(), b.cols = get<std::int64_t>();
      b.values = get_vector<cplx>();
    }
    return s;
  }
  std::string get_string() {
    std::string v(get<std::uint64_t>(), '\0');
    take(v.data(), v.size());
    return v;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  void take(void* dst, std::size_t bytes) {
    if (at_ + bytes > in_.size()) throw std::logic_error("mps: the computed result is cut short");
    if (bytes) std::memcpy(dst, in_.data() + at_, bytes);
    at_ += bytes;
  }
  std::string_view in_;  // (the caller keeps the bytes)
  std::size_t at_ = 0;
};

}  // namespace qstage::stages::mps
