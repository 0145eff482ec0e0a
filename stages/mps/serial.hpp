#pragma once
// The MPS stages' runs save their state and measurements as raw little-endian values (bit for
// bit, NaN included; core/serial.hpp); mps.tebd's ranks exchange the sites they updated the same
// way (LayerUpdater).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/serial.hpp"
#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

// The MPS's own parts on top of the common packing.
class Packer : public qstage::Packer {
 public:
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
};

class Unpacker : public qstage::Unpacker {
 public:
  using qstage::Unpacker::Unpacker;
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
};

}  // namespace qstage::stages::mps
