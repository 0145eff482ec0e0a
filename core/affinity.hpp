#pragma once
// Binding a rank to the cores and memory nearest its GPU (seed 002 section 2.2.5): a GPU hangs off
// one socket's PCIe root, and host buffers on the other socket cross the inter-socket link on
// every copy. Linux describes each PCI device in sysfs: `numa_node` (-1 where the machine has no
// NUMA information) and `local_cpulist` (the cores of that node), which is all this needs (no hwloc).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qstage::affinity {

// "0-3,8,10-11" as sorted, unique cpu numbers; InputError on anything else.
std::vector<int> parse_cpu_list(std::string_view text);
// The inverse, ranges compressed: {0, 1, 2, 3, 8} -> "0-3,8".
std::string format_cpu_list(const std::vector<int>& cpus);

// Where a PCI device sits, from `sysfs` (normally /sys) and its bus id as CUDA gives it
// ("0000:3B:00.0"; sysfs spells it in lower case).
struct DevicePlacement {
  std::string bus_id;
  int numa_node = -1;     // -1: not reported
  std::vector<int> cpus;  // the node's cores; empty where not reported
};
DevicePlacement device_placement(const std::filesystem::path& sysfs, const std::string& bus_id);

// The cores this thread may run on now (what the launcher, SLURM or taskset allowed).
std::vector<int> allowed_cpus();

// Prefers the placement's node for the memory the calling thread (and the threads it starts
// later: OpenMP's, the I/O pool's) touches from then on (pinned staging buffers included), and,
// with `cores`, binds them to the placement's cores that it is allowed. Leaves everything as it
// was where the device has no node, or (with `cores`) none of its cores is allowed. Returns one
// line saying what it did.
std::string bind_near(const DevicePlacement& placement, bool cores = true);

// The cores this process's cpuset cgroup gives it (what SLURM allocated the job; cgroup v2 or
// v1), or every online core where there is no such cgroup.
std::size_t cgroup_cpu_count(const std::filesystem::path& root = "/");
// The memory this process's cgroup and those above it allow (SLURM's --mem where the cluster
// constrains it; cgroup v2 or v1), the least of their limits; nullopt where none is set.
std::optional<std::uint64_t> cgroup_memory_limit(const std::filesystem::path& root = "/");

// A warning when the launcher left this rank a small share of what the job has: the
// `local_ranks` ranks on the host, each allowed `allowed` cores, use fewer than half of the
// `job_cores` its cgroup gives it. OpenMPI binds every rank to one core when -np is 1 or 2 (a
// 2-rank sci.solve ran 3x slower than one rank on a 64-core host: 16 OpenMP threads and the I/O
// pool on one core). Empty where the share is fair.
std::string starved_binding_warning(std::size_t allowed, int local_ranks, std::size_t job_cores);

}  // namespace qstage::affinity
