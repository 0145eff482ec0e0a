// core/affinity: cpu lists, a device's NUMA placement read from a sysfs tree made here, and the
// binding itself (to a subset of the cores this test may use, restored afterwards).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/affinity.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace qstage;
namespace fs = std::filesystem;

TEST(Affinity, CpuListsParseAndFormat) {
  EXPECT_EQ(affinity::parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(affinity::parse_cpu_list("5,1-2,2"), (std::vector<int>{1, 2, 5}));
  EXPECT_EQ(affinity::format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(affinity::format_cpu_list({}), "");
  EXPECT_EQ(affinity::format_cpu_list(affinity::parse_cpu_list("0-63")), "0-63");
  for (const char* bad : {"", "1-", "a", "3-1", "1,,2", "1 2"}) EXPECT_THROW(affinity::parse_cpu_list(bad), InputError) << bad;
}

TEST(Affinity, TheDevicePlacementComesFromSysfs) {
  const fs::path root = fs::temp_directory_path() / "qstage-affinity-sysfs";
  fs::remove_all(root);
  const fs::path dev = root / "bus" / "pci" / "devices" / "0000:3b:00.0";
  fs::create_directories(dev);
  std::ofstream(dev / "numa_node") << "1\n";
  std::ofstream(dev / "local_cpulist") << "16-31,48-63\n";
  // (CUDA spells the bus id in upper case)
  const auto p = affinity::device_placement(root, "0000:3B:00.0");
  EXPECT_EQ(p.numa_node, 1);
  EXPECT_EQ(affinity::format_cpu_list(p.cpus), "16-31,48-63");
  // a machine without NUMA information, and a device sysfs does not know
  std::ofstream(dev / "numa_node") << "-1\n";
  EXPECT_EQ(affinity::device_placement(root, "0000:3B:00.0").numa_node, -1);
  const auto missing = affinity::device_placement(root, "0000:AF:00.0");
  EXPECT_EQ(missing.numa_node, -1);
  EXPECT_TRUE(missing.cpus.empty());
  EXPECT_NE(affinity::bind_near(missing).find("not bound"), std::string::npos);
  fs::remove_all(root);
}

TEST(Affinity, BindingKeepsToTheAllowedCoresOfTheNode) {
  const std::vector<int> allowed = affinity::allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  // a node of the first allowed core and one we may not use: bound to the first alone
  affinity::DevicePlacement p{"0000:00:00.0", 0, {allowed.front(), CPU_SETSIZE - 1}};
  const std::string line = affinity::bind_near(p);
  EXPECT_NE(line.find(fmt::format("bound to cores {}", allowed.front())), std::string::npos) << line;
  EXPECT_EQ(affinity::allowed_cpus(), std::vector<int>{allowed.front()});
  // memory only: every allowed core kept
  affinity::DevicePlacement wide{"0000:00:00.0", 0, {CPU_SETSIZE - 1}};
  EXPECT_NE(affinity::bind_near(wide, false).find("every allowed core kept"), std::string::npos);
  EXPECT_EQ(affinity::allowed_cpus(), std::vector<int>{allowed.front()});
  // a node none of whose cores is allowed: left as it was
  affinity::DevicePlacement elsewhere{"0000:00:00.0", 0, {CPU_SETSIZE - 1}};
  EXPECT_NE(affinity::bind_near(elsewhere).find("none of them is allowed"), std::string::npos);
  EXPECT_EQ(affinity::allowed_cpus(), std::vector<int>{allowed.front()});
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(affinity::allowed_cpus(), allowed);
}

TEST(Affinity, TheJobsCoresComeFromItsCpusetCgroup) {
  const fs::path root = fs::temp_directory_path() / "qstage-affinity-cgroup";
  fs::remove_all(root);
  fs::create_directories(root / "proc" / "self");
  // cgroup v2: the job's group gives 16 cores
  fs::create_directories(root / "sys/fs/cgroup/slurm/job_7");
  std::ofstream(root / "proc/self/cgroup") << "0::/slurm/job_7\n";
  std::ofstream(root / "sys/fs/cgroup/slurm/job_7/cpuset.cpus.effective") << "0-7,32-39\n";
  EXPECT_EQ(affinity::cgroup_cpu_count(root), 16u);
  // cgroup v1: the cpuset controller's line
  fs::create_directories(root / "sys/fs/cgroup/cpuset/job_8");
  std::ofstream(root / "proc/self/cgroup") << "4:memory:/x\n3:cpuset:/job_8\n0::/\n";
  std::ofstream(root / "sys/fs/cgroup/cpuset/job_8/cpuset.effective_cpus") << "4-5\n";
  EXPECT_EQ(affinity::cgroup_cpu_count(root), 2u);
  // no cpuset files: every online core
  std::ofstream(root / "proc/self/cgroup") << "0::/nowhere\n";
  EXPECT_EQ(affinity::cgroup_cpu_count(root), static_cast<std::size_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  fs::remove_all(root);
}

TEST(Affinity, TheJobsMemoryLimitIsTheLeastOfItsCgroupAndThoseAbove) {
  const fs::path root = fs::temp_directory_path() / "qstage-affinity-memory";
  fs::remove_all(root);
  fs::create_directories(root / "proc" / "self");
  // cgroup v2, as SLURM makes it: the job's group has --mem, the task's below it says "max"
  fs::create_directories(root / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/user/task_0");
  std::ofstream(root / "proc/self/cgroup") << "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n";
  std::ofstream(root / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/memory.max") << "17179869184\n";
  std::ofstream(root / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/memory.max") << "max\n";
  std::ofstream(root / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/user/task_0/memory.max") << "max\n";
  EXPECT_EQ(affinity::cgroup_memory_limit(root), std::optional<std::uint64_t>(16ull << 30));
  // a lower limit further down wins
  std::ofstream(root / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/memory.max") << "8589934592\n";
  EXPECT_EQ(affinity::cgroup_memory_limit(root), std::optional<std::uint64_t>(8ull << 30));
  // cgroup v1: the memory controller's line (with others on it); "no limit" is about 2^63
  fs::create_directories(root / "sys/fs/cgroup/memory/slurm/uid_0/job_8/step_batch");
  std::ofstream(root / "proc/self/cgroup")
      << "4:cpuset:/slurm/uid_0/job_8\n3:memory,hugetlb:/slurm/uid_0/job_8/step_batch\n";
  std::ofstream(root / "sys/fs/cgroup/memory/memory.limit_in_bytes") << "9223372036854771712\n";
  std::ofstream(root / "sys/fs/cgroup/memory/slurm/uid_0/job_8/memory.limit_in_bytes") << "4294967296\n";
  std::ofstream(root / "sys/fs/cgroup/memory/slurm/uid_0/job_8/step_batch/memory.limit_in_bytes")
      << "9223372036854771712\n";
  EXPECT_EQ(affinity::cgroup_memory_limit(root), std::optional<std::uint64_t>(4ull << 30));
  // none set anywhere, or no such files: no limit
  std::ofstream(root / "sys/fs/cgroup/memory/slurm/uid_0/job_8/memory.limit_in_bytes") << "9223372036854771712\n";
  EXPECT_EQ(affinity::cgroup_memory_limit(root), std::nullopt);
  std::ofstream(root / "proc/self/cgroup") << "0::/nowhere\n";
  EXPECT_EQ(affinity::cgroup_memory_limit(root), std::nullopt);
  fs::remove_all(root);
}

TEST(Affinity, ARankLeftOneCoreOfManyIsWarnedAbout) {
  // OpenMPI's -np 2 on a 64-core host: one core a rank
  const std::string w = affinity::starved_binding_warning(1, 2, 64);
  EXPECT_NE(w.find("1 of the job's 64 cores"), std::string::npos) << w;
  EXPECT_NE(w.find("--bind-to none"), std::string::npos) << w;
  // fair shares: 2 ranks of 32 cores, 8 ranks of 4 (half the job), a 2-core machine, one core alone
  EXPECT_EQ(affinity::starved_binding_warning(32, 2, 64), "");
  EXPECT_EQ(affinity::starved_binding_warning(4, 8, 64), "");
  EXPECT_EQ(affinity::starved_binding_warning(1, 2, 2), "");
  EXPECT_EQ(affinity::starved_binding_warning(1, 1, 1), "");
  EXPECT_NE(affinity::starved_binding_warning(3, 8, 64), "");
}
