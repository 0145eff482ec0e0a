// core/affinity: cpu lists, a device's NUMA placement read from a sysfs tree made here, and the
// binding itself (to a subset of the cores this test may use, restored afterwards).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sched.h>

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
