// sci.integrals: an FCIDUMP file (stages/sci/fcidump.hpp) into HDF5: the one- and two-electron
// integrals, the core energy and the header's numbers, and the excitation tables generation
// reads (stages/sci/excitation_tables.hpp), as the later selected-CI steps and h5py read them.
#include <fmt/format.h>

#include <cstring>

#include "core/error.hpp"
#include "stages/sci/excitation_tables.hpp"
#include "stages/sci/fcidump.hpp"
#include "stages/sci/sci_stages.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;

// The layout of /eri, as its attribute `layout` says it.
constexpr const char* kEriLayout =
    "s8: pair(i,j)=i(i+1)/2+j, i>=j, 0-based; eri[pair(pair(i,j),pair(k,l))] = (ij|kl)";

// The run reads the file on rank 0; the other ranks get the integrals for write() as one
// string (its saved state): a JSON line (the header's numbers, the core energy, the counts), then h1, eri and
// orbital_energies as raw float64 (bit for bit, NaN included).
std::string serialize(const sci::Integrals& in) {
  const json head{{"norb", in.norb},     {"nelec", in.nelec},
                  {"ms2", in.ms2},       {"isym", in.isym},
                  {"orbsym", in.orbsym}, {"integral_lines", in.integral_lines},
                  {"repeated_lines", in.repeated_lines}};
  std::string out = head.dump() + '\n';
  auto append = [&out](const double* values, std::size_t count) {
    out.append(reinterpret_cast<const char*>(values), count * sizeof(double));
  };
  append(&in.core, 1);  // (raw too: JSON would round-trip it, but one path for every double)
  append(in.h1.data(), in.h1.size());
  append(in.eri.data(), in.eri.size());
  append(in.orbital_energies.data(), in.orbital_energies.size());
  return out;
}

sci::Integrals deserialize(const std::string& s) {
  const std::size_t newline = s.find('\n');
  const json head = json::parse(s.substr(0, newline));
  sci::Integrals in;
  in.norb = head.at("norb").get<int>();
  in.nelec = head.at("nelec").get<int>();
  in.ms2 = head.at("ms2").get<int>();
  in.isym = head.at("isym").get<int>();
  in.orbsym = head.at("orbsym").get<std::vector<int>>();
  in.integral_lines = head.at("integral_lines").get<std::uint64_t>();
  in.repeated_lines = head.at("repeated_lines").get<std::uint64_t>();
  const auto n = static_cast<std::size_t>(in.norb);
  std::size_t at = newline + 1;
  auto take = [&](double* values, std::size_t count) {
    const std::size_t bytes = count * sizeof(double);
    if (at + bytes > s.size()) throw std::logic_error("sci.integrals: the computed integrals are cut short");
    std::memcpy(values, s.data() + at, bytes);
    at += bytes;
  };
  take(&in.core, 1);
  in.h1.resize(n * n);
  take(in.h1.data(), in.h1.size());
  in.eri.resize(sci::packed_eri_size(in.norb));
  take(in.eri.data(), in.eri.size());
  in.orbital_energies.resize(n);
  take(in.orbital_energies.data(), n);
  if (at != s.size()) throw std::logic_error("sci.integrals: the computed integrals have bytes left over");
  return in;
}

class IntegralsStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "sci.integrals", 1,
        "molecular integrals from an FCIDUMP file (restricted orbitals, at most 64) into HDF5: h1, the 8-fold packed "
        "(ij|kl), the core energy, NORB, NELEC, MS2, ORBSYM",
        {},
        "- id: ints\n  stage: sci.integrals\n  params: {fcidump: FCIDUMP}\n"};
    return info;
  }
  std::vector<std::string> file_parameters() const override { return {"/fcidump"}; }
  StagePlan plan(const json&, const std::map<std::string, DatasetInfo>&) const override {
    // Sizes follow NORB, which only the file says: no shapes here (scalars and arrays alike).
    auto result = [](DType t) { return DatasetInfo{{t, {}, {}}}; };
    return computed_plan({{"h1", result(DType::float64)},
                          {"eri", result(DType::float64)},
                          {"core_energy", result(DType::float64)},
                          {"orbsym", result(DType::int32)},
                          {"orbital_energies", result(DType::float64)},
                          {"norb", result(DType::int64)},
                          {"nelec", result(DType::int64)},
                          {"ms2", result(DType::int64)},
                          {"isym", result(DType::int64)},
                          {"integral_lines", result(DType::uint64)},
                          {"repeated_lines", result(DType::uint64)}});
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public ComputedRun {
   public:
    using ComputedRun::ComputedRun;
    void compute() override { ints_ = sci::read_fcidump(ctx_.files.at("/fcidump")); }
    std::string save() const override { return serialize(ints_); }
    void load(std::string_view state) override { ints_ = deserialize(std::string(state)); }
    void write(const StagePlan&, const StepPass&, h5::File& out) const override { write_integrals(ints_, out); }
    std::string describe(const StagePlan&, const StepPass&) const override {
      const sci::Integrals& in = ints_;
      return fmt::format("norb {}, nelec {}, ms2 {} ({} alpha, {} beta), {} integral lines ({} repeated), core energy "
                         "{:.12f}",
                         in.norb, in.nelec, in.ms2, in.nalpha(), in.nbeta(), in.integral_lines, in.repeated_lines,
                         in.core);
    }

   private:
    sci::Integrals ints_;
  };

  static void write_integrals(const sci::Integrals& in, h5::File& out) {
    const auto n = static_cast<std::uint64_t>(in.norb);
    detail::write_array(out, "h1", DType::float64, {n, n}, in.h1.data(),
                        "one-electron integrals h_ij (hartree), symmetric, 0-based orbitals");
    detail::write_array(out, "eri", DType::float64, {in.eri.size()}, in.eri.data(),
                        "two-electron integrals (ij|kl) in chemists' notation (hartree), 8-fold packed as the "
                        "attribute 'layout' says (PySCF's ao2mo 's8'; pyscf.ao2mo.restore(1, eri, norb) unpacks it)")
        .set_attribute("layout", kEriLayout);
    detail::write_scalar(out, "core_energy", DType::float64, &in.core,
                         "the core energy (nuclear repulsion plus frozen core, hartree): the file's 0 0 0 0 line, 0 "
                         "without one");
    const std::vector<std::int32_t> orbsym(in.orbsym.begin(), in.orbsym.end());
    detail::write_array(out, "orbsym", DType::int32, {n}, orbsym.data(),
                        "irrep label of each orbital as the file's ORBSYM gives it (all 1 without ORBSYM)");
    detail::write_array(out, "orbital_energies", DType::float64, {n}, in.orbital_energies.data(),
                        "orbital energies from the file's 'e i 0 0 0' lines (hartree); NaN where the file gives none");
    auto integer = [&](const char* name, std::int64_t v, const char* doc) {
      detail::write_scalar(out, name, DType::int64, &v, doc);
    };
    integer("norb", in.norb, "NORB: spatial orbitals");
    integer("nelec", in.nelec, "NELEC: electrons (both spins)");
    integer("ms2", in.ms2, "MS2: 2 S_z, alpha minus beta electrons");
    integer("isym", in.isym, "ISYM: the irrep label of the wave function (1 without ISYM)");
    detail::write_scalar(out, "integral_lines", DType::uint64, &in.integral_lines,
                         "value lines after the header (integrals, orbital energies and the core line)");
    detail::write_scalar(out, "repeated_lines", DType::uint64, &in.repeated_lines,
                         "of them, integrals given again in another of their orders (the first kept)");
    write_excitations(in, out);
  }
  // The tables under /excitations, each list table (lists, width) with its padded width as the
  // attribute `width`. They are built again on every rank from the same integrals (the builder is
  // deterministic), rather than sent from rank 0.
  static void write_excitations(const sci::Integrals& in, h5::File& out) {
    const sci::ExcitationTables t = sci::build_excitation_tables(in);
    const auto n = static_cast<std::uint64_t>(in.norb);
    detail::write_array(out, "excitations/coulomb", DType::float64, {n, n}, t.coulomb.data(), "J_pq = (pp|qq)");
    detail::write_array(out, "excitations/exchange", DType::float64, {n, n}, t.exchange.data(), "K_pq = (pq|qp)");
    // HDF5 here has no uint16 or uint32: lengths and packed (r, s) targets are widened to int32.
    auto widened = [](const auto& v) { return std::vector<std::int32_t>(v.begin(), v.end()); };
    auto table = [&](const std::string& kind, std::uint32_t width, const auto& length, const std::string& lists,
                     const std::string& target_doc, DType target_type, const void* target, const char* value_name,
                     const std::vector<double>& value, const std::string& value_doc) {
      const std::uint64_t count = length.size(), w = width;
      const auto len = widened(length);
      auto with_width = [&](h5::Dataset d) { d.set_attribute("width", static_cast<std::int64_t>(width)); };
      with_width(detail::write_array(out, ("excitations/" + kind + "_length").c_str(), DType::int32, {count},
                                     len.data(), ("entries of each list (" + lists + "); the rest of its row of "
                                                  "width entries is padding (0)").c_str()));
      with_width(detail::write_array(out, ("excitations/" + kind + "_target").c_str(), target_type, {count, w},
                                     target, target_doc.c_str()));
      with_width(detail::write_array(out, ("excitations/" + kind + "_" + value_name).c_str(), DType::float64,
                                     {count, w}, value.data(), value_doc.c_str()));
    };
    table("single", t.single_width, t.single_length, "row p: orbital p", "target orbital r != p of row p",
          DType::uint8, t.single_target.data(), "bound", t.single_bound,
          "upper bound of |<D'|H|D>| of the single p -> r over every determinant: |h_pr| + sum_k max(|(pr|kk)|, "
          "|(pr|kk) - (pk|kr)|); each row sorted by it, descending");
    const auto opposite = widened(t.opposite_target), same = widened(t.same_target);
    table("opposite", t.opposite_width, t.opposite_length, "row p * norb + q: p alpha, q beta",
          "targets r | s << 8 (r alpha != p, s beta != q)", DType::int32, opposite.data(), "value", t.opposite_value,
          "(pr|qs), each row sorted by |value| descending (ties: (r, s) ascending); zeros left out");
    table("same", t.same_width, t.same_length, "row q(q-1)/2 + p: the same-spin pair p < q",
          "targets r | s << 8 (r < s, both outside {p, q})", DType::int32, same.data(), "value", t.same_value,
          "(pr|qs) - (ps|qr), each row sorted by |value| descending (ties: (r, s) ascending); zeros left out");
  }
};

}  // namespace

const Stage& sci_integrals() {
  static const IntegralsStage stage;
  return stage;
}

}  // namespace qstage::stages
