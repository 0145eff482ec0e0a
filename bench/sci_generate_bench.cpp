// qstage_bench sci-generate: the coupled-configuration generation kernel's rate (candidates per
// second) on a backend, for an FCIDUMP and random source determinants (the rate depends on the
// electron and orbital counts and the screening, not on which determinants they are).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "kernels/sci/sci_generate.hpp"
#include "sci_generate_bench.hpp"
#include "stages/sci/excitation_tables.hpp"
#include "stages/sci/fcidump.hpp"

namespace qstage::bench {

using kernels::sci::Candidate;
using kernels::sci::Det;

namespace {

std::uint64_t random_string(std::mt19937_64& rng, int norb, int k) {
  std::vector<int> orbitals(norb);
  for (int i = 0; i < norb; ++i) orbitals[i] = i;
  std::shuffle(orbitals.begin(), orbitals.end(), rng);
  std::uint64_t s = 0;
  for (int i = 0; i < k; ++i) s |= std::uint64_t{1} << orbitals[i];
  return s;
}

}  // namespace

nlohmann::json sci_generate_bench(const std::map<std::string, std::string>& args) {
  const auto get = [&](const std::string& k, const std::string& d) { return args.count(k) ? args.at(k) : d; };
  const sci::Integrals ints = sci::read_fcidump(get("fcidump", ""));
  const sci::ExcitationTables tables = sci::build_excitation_tables(ints);
  const std::uint64_t sources = std::stoull(get("sources", "100000")), batch = std::stoull(get("batch", "2000"));
  const double eps = std::stod(get("eps", "0"));
  const int na = ints.nalpha(), nb = ints.nbeta();
  std::mt19937_64 rng(std::stoull(get("seed", "1")));
  std::vector<Det> dets(sources);
  std::vector<double> c(sources);
  std::uniform_real_distribution<double> u(-1, 1);
  for (std::uint64_t i = 0; i < sources; ++i) {
    dets[i] = Det{random_string(rng, ints.norb, na), random_string(rng, ints.norb, nb)};
    c[i] = eps > 0 ? u(rng) : 1.0;
  }
  auto backend = make_backend({get("device", "cuda"), 0, 0, 0});
  auto stream = backend->make_stream();
  sci::ResidentHamiltonian h(*backend, *stream, ints, tables);
  const std::uint64_t per_source = sci::max_candidates_per_source(tables, na, nb);
  Buffer d_dets = backend->alloc_device(sources * sizeof(Det), "bench sources");
  Buffer d_c = backend->alloc_device(sources * 8, "bench coefficients");
  backend->copy_to_device(d_dets.data(), dets.data(), sources * sizeof(Det), *stream);
  backend->copy_to_device(d_c.data(), c.data(), sources * 8, *stream);
  Buffer out = backend->alloc_device(batch * per_source * sizeof(Candidate), "bench candidates");
  Buffer work = backend->alloc_device(2 * batch * 8, "bench workspace");
  Buffer scan = backend->alloc_device(kernels::kSciScanWorkspaceBytes, "bench scan");
  Buffer counts = backend->alloc_device((sources / batch + 1) * 8, "bench counts");
  auto run = [&] {
    std::uint64_t b = 0;
    for (std::uint64_t first = 0; first < sources; first += batch, ++b) {
      const std::uint64_t n = std::min(batch, sources - first);
      kernels::SciGenerate g{h.view(), na, nb, d_dets.as<Det>() + first, d_c.as<double>() + first, n, eps,
                             out.as<Candidate>(), counts.as<std::uint64_t>() + b, work.as<std::uint64_t>(), scan.data(), {}};
      kernels::sci_generate(*stream, g);
    }
    stream->synchronize();
  };
  run();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  run();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::uint64_t> per_batch(sources / batch + 1, 0);
  backend->copy_to_host(per_batch.data(), counts.data(), per_batch.size() * 8, *stream);
  stream->synchronize();
  std::uint64_t candidates = 0;
  for (std::uint64_t b = 0; b * batch < sources; ++b) candidates += per_batch[b];
  return {{"device", backend->description()},
          {"threads", omp_get_max_threads()},
          {"norb", ints.norb},
          {"nelec", ints.nelec},
          {"sources", sources},
          {"batch", batch},
          {"eps", eps},
          {"max_candidates_per_source", per_source},
          {"candidates", candidates},
          {"seconds", seconds},
          {"candidates_per_second", candidates / seconds},
          {"GBps_written", candidates * sizeof(Candidate) / seconds / 1e9}};
}

}  // namespace qstage::bench
