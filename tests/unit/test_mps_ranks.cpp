// Which updates of a layer each of mps.tebd's ranks computes (docs/mps.md "Ranks"); the ranks'
// exchange itself is tested under mpirun (tests/mpi/test_mps_ranks.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "stages/mps/tebd.hpp"

using namespace qstage::stages::mps;

TEST(MpsRanks, OwnedUpdatesSplitTheListRoundRobin) {
  EXPECT_EQ(owned_updates(7, 0, 3), (std::vector<std::int64_t>{0, 3, 6}));
  EXPECT_EQ(owned_updates(7, 2, 3), (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(owned_updates(1, 0, 4), (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(owned_updates(1, 1, 4).empty());
  EXPECT_EQ(owned_updates(3, 0, 1), (std::vector<std::int64_t>{0, 1, 2}));
  // a layer that starts at rank `first`
  EXPECT_EQ(owned_updates(7, 0, 3, 1), (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(owned_updates(7, 1, 3, 1), (std::vector<std::int64_t>{0, 3, 6}));
  EXPECT_EQ(owned_updates(1, 2, 4, 2), (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(owned_updates(1, 0, 4, 2).empty());
}
