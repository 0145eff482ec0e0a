#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/mpi.hpp"

namespace qstage::bench {
// qstage_bench pass-overhead [--passes 50] [--rows 4096] [--resident 16MiB] [--slots 3] [--device cuda|cpu]
//     [--dir DIR]: the fixed cost of a pass (bench/pass_overhead_bench.cpp)
nlohmann::json pass_overhead_bench(const std::map<std::string, std::string>& args, const mpi::Comm& comm);
}  // namespace qstage::bench
