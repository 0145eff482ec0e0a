#include "core/affinity.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.hpp"

namespace qstage::affinity {

namespace {

int parse_number(std::string_view s, std::string_view whole) {
  if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    throw InputError(fmt::format("cpu list '{}': '{}' is not a cpu number; expected e.g. 0-3,8,10-11", whole, s));
  return std::stoi(std::string(s));
}

std::string read_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

// set_mempolicy(2) without libnuma: MPOL_PREFERRED with one node in the mask.
bool prefer_node(int node) {
  constexpr int kMpolPreferred = 1;
  constexpr int kBits = 8 * sizeof(unsigned long);
  if (node < 0 || node >= 16 * kBits) return false;
  unsigned long mask[16] = {};
  mask[node / kBits] = 1ul << (node % kBits);
  return syscall(SYS_set_mempolicy, kMpolPreferred, mask, static_cast<unsigned long>(16 * kBits + 1)) == 0;
}

}  // namespace

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    const std::size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      cpus.push_back(parse_number(item, text));
    } else {
      const int lo = parse_number(item.substr(0, dash), text), hi = parse_number(item.substr(dash + 1), text);
      if (hi < lo) throw InputError(fmt::format("cpu list '{}': the range '{}' runs backwards; expected low-high", text, item));
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    }
    at = comma + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

DevicePlacement device_placement(const std::filesystem::path& sysfs, const std::string& bus_id) {
  DevicePlacement p;
  p.bus_id = bus_id;
  std::string lower = bus_id;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::filesystem::path dir = sysfs / "bus" / "pci" / "devices" / lower;
  const std::string node = read_line(dir / "numa_node");
  if (!node.empty()) {
    try {
      p.numa_node = std::stoi(node);
    } catch (const std::exception&) {
      p.numa_node = -1;
    }
  }
  const std::string cpus = read_line(dir / "local_cpulist");
  if (!cpus.empty()) {
    try {
      p.cpus = parse_cpu_list(cpus);
    } catch (const InputError&) {
      p.cpus.clear();
    }
  }
  return p;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::string bind_near(const DevicePlacement& placement, bool cores) {
  const std::string device = fmt::format("GPU at PCI {}", placement.bus_id);
  if (placement.numa_node < 0 || placement.cpus.empty())
    return fmt::format("{}: no NUMA node reported, not bound", device);
  if (!cores)
    return fmt::format("{} on NUMA node {} (cores {}): {}, every allowed core kept", device, placement.numa_node,
                       format_cpu_list(placement.cpus),
                       prefer_node(placement.numa_node) ? "memory preferred there" : "the memory policy was refused");
  const std::vector<int> allowed = allowed_cpus();
  std::vector<int> near;
  std::set_intersection(placement.cpus.begin(), placement.cpus.end(), allowed.begin(), allowed.end(), std::back_inserter(near));
  if (near.empty())
    return fmt::format("{} on NUMA node {} (cores {}): none of them is allowed here (cores {}), not bound", device, placement.numa_node,
                       format_cpu_list(placement.cpus), format_cpu_list(allowed));
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : near) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0)
    return fmt::format("{} on NUMA node {}: binding to cores {} failed ({}), not bound", device, placement.numa_node,
                       format_cpu_list(near), std::strerror(errno));
  const bool memory = prefer_node(placement.numa_node);
  return fmt::format("{} on NUMA node {}: bound to cores {}{}", device, placement.numa_node, format_cpu_list(near),
                     memory ? ", memory preferred there" : " (the memory policy was refused)");
}

namespace {

// This process's cgroups from /proc/self/cgroup: (controllers, path) a line, "0::/path" (v2, no
// controllers) or "3:cpuset:/path" (v1); the path relative to the hierarchy's root.
std::vector<std::pair<std::string, std::filesystem::path>> own_cgroups(const std::filesystem::path& root) {
  std::vector<std::pair<std::string, std::filesystem::path>> out;
  std::ifstream groups(root / "proc/self/cgroup");
  std::string line;
  while (std::getline(groups, line)) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    out.emplace_back(line.substr(first + 1, second - first - 1),
                     std::filesystem::path(line.substr(second + 1)).relative_path());
  }
  return out;
}

// The first line of a cgroup file ("" where it cannot be read).
std::string first_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!in || !std::getline(in, text)) return {};
  return text;
}

}  // namespace

std::size_t cgroup_cpu_count(const std::filesystem::path& root) {
  auto count = [](const std::filesystem::path& file) -> std::size_t {
    const std::string text = first_line(file);
    if (text.empty()) return 0;
    try {
      return parse_cpu_list(text).size();
    } catch (const InputError&) {
      return 0;
    }
  };
  for (const auto& [controllers, rel] : own_cgroups(root)) {
    std::size_t n = 0;
    if (controllers.empty()) n = count(root / "sys/fs/cgroup" / rel / "cpuset.cpus.effective");
    else if (controllers == "cpuset") n = count(root / "sys/fs/cgroup/cpuset" / rel / "cpuset.effective_cpus");
    if (n > 0) return n;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<std::size_t>(online) : 1;
}

std::optional<std::uint64_t> cgroup_memory_limit(const std::filesystem::path& root) {
  // (a limit holds for the group and everything below it: SLURM sets the job's, and the process
  // runs in a step's or a task's group beneath, whose own file says "max")
  std::optional<std::uint64_t> least;
  const auto consider = [&](const std::filesystem::path& file) {
    const std::string text = first_line(file);
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return;  // ("max": none)
    try {
      const std::uint64_t bytes = std::stoull(text);
      if (bytes < (std::uint64_t{1} << 62))
        least = std::min(least.value_or(bytes), bytes);  // (v1's "none": about 2^63)
    } catch (const std::exception&) {}
  };
  for (const auto& [controllers, rel] : own_cgroups(root)) {
    const bool v2 = controllers.empty();
    bool memory = v2;
    for (std::size_t at = 0; !memory && at != std::string::npos;) {  // (v1: "memory" among the line's controllers)
      const std::size_t comma = controllers.find(',', at);
      memory = controllers.substr(at, comma == std::string::npos ? std::string::npos : comma - at) == "memory";
      at = comma == std::string::npos ? comma : comma + 1;
    }
    if (!memory) continue;
    const std::filesystem::path base = root / (v2 ? "sys/fs/cgroup" : "sys/fs/cgroup/memory");
    for (std::filesystem::path group = rel;; group = group.parent_path()) {
      consider(base / group / (v2 ? "memory.max" : "memory.limit_in_bytes"));
      if (group.empty()) break;
    }
  }
  return least;
}

std::string starved_binding_warning(std::size_t allowed, int local_ranks, std::size_t job_cores) {
  const auto used = allowed * static_cast<std::size_t>(std::max(local_ranks, 1));
  if (job_cores <= 1 || allowed == 0 || 2 * used >= job_cores) return {};
  return fmt::format("the launcher allows this rank {} of the job's {} cores ({} ranks on this host use {}): its OpenMP "
                     "and I/O threads share them; OpenMPI binds each rank to one core when -np is 1 or 2: run mpirun "
                     "with --bind-to none, or --map-by slot:PE=<cores a rank>",
                     allowed, job_cores, std::max(local_ranks, 1), used);
}

}  // namespace qstage::affinity
