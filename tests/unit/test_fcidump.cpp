// The FCIDUMP reader: every header and line variant real files use, the four test files of
// tests/data/fcidump (Dice's), and bad files refused with their line number.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "stages/sci/fcidump.hpp"
#include "test_data.hpp"

using namespace qstage;

namespace {

// The error message of parsing `text`, or "" if it parses.
std::string error_of(const std::string& text) {
  try {
    sci::parse_fcidump(text, "t.fcidump");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string data_file(const std::string& name) { return qstage::testing::test_data("fcidump/" + name); }

}  // namespace

TEST(Fcidump, OneLineHeaderCoreFirstFortranExponentsAndAnyPermutation) {
  const std::string text =
      "&fci norb=2,nelec=2,ms2=0,orbsym=1,2,isym=1,uhf=.false. &end\n"
      "  0.7D+00  0 0 0 0\n"
      "  0.65D0   1 1 1 1\n"
      " -1.5E-01  2 1 1 1\n"   // (21|11): stored as (11|21)
      "  0.2      1 2 2 1\n"   // (12|21) = (21|12) = (12|12)
      "  0.6      2 2 2 2\n"
      "  0.3      2 2 1 1\n"
      " -1.25     1 1 0 0\n"
      "  0.05     1 2 0 0\n"
      " -0.5      2 2 0 0\n"
      " -0.9      1 0 0 0\n";
  const sci::Integrals r = sci::parse_fcidump(text, "t");
  EXPECT_EQ(r.norb, 2);
  EXPECT_EQ(r.nelec, 2);
  EXPECT_EQ(r.nalpha(), 1);
  EXPECT_EQ(r.nbeta(), 1);
  EXPECT_EQ(r.orbsym, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.core, 0.7);
  EXPECT_EQ(r.eri.size(), sci::packed_eri_size(2));
  EXPECT_EQ(r.eri.size(), 6u);
  EXPECT_EQ(r.eri_at(0, 0, 0, 0), 0.65);
  // All 8 orders of (11|21) find the one value.
  for (auto [i, j, k, l] : std::vector<std::array<int, 4>>{{0, 0, 1, 0}, {0, 0, 0, 1}, {1, 0, 0, 0}, {0, 1, 0, 0}})
    EXPECT_EQ(r.eri_at(i, j, k, l), -0.15);
  EXPECT_EQ(r.eri_at(0, 1, 0, 1), 0.2);
  EXPECT_EQ(r.eri_at(1, 0, 1, 0), 0.2);
  EXPECT_EQ(r.eri_at(1, 1, 0, 0), 0.3);
  EXPECT_EQ(r.h1_at(0, 1), 0.05);
  EXPECT_EQ(r.h1_at(1, 0), 0.05);
  EXPECT_EQ(r.h1_at(1, 1), -0.5);
  EXPECT_EQ(r.orbital_energies[0], -0.9);  // an orbital energy, not the core
  EXPECT_TRUE(std::isnan(r.orbital_energies[1]));
  EXPECT_EQ(r.integral_lines, 10u);
}

TEST(Fcidump, MultiLineHeadersEndingInSlashOrDollarEndAndCoreLast) {
  for (const char* end : {" /", "$END", " &END"}) {
    const std::string text = std::string(" &FCI NORB=  3,NELEC=3,MS2=1,\n  ORBSYM=1,1,1,\n  ISYM=1,\n") + end +
                             "\n 0.5 1 1 1 1\n -1.0 1 1 0 0\n 9.25 0 0 0 0\n";
    const sci::Integrals r = sci::parse_fcidump(text, "t");
    EXPECT_EQ(r.norb, 3) << end;
    EXPECT_EQ(r.nalpha(), 2) << end;
    EXPECT_EQ(r.nbeta(), 1) << end;
    EXPECT_EQ(r.core, 9.25) << end;
    EXPECT_EQ(r.eri_at(0, 0, 0, 0), 0.5) << end;
  }
}

TEST(Fcidump, BadFilesNameTheLineAndWhatWasExpected) {
  const std::string head = "&FCI NORB=2,NELEC=2,MS2=0 &END\n";
  EXPECT_NE(error_of(head + " 0.5 1 1 1 1\n 0.25 1 1\n").find("t.fcidump:3: 3 fields; expected 5"), std::string::npos);
  EXPECT_NE(error_of(head + " 0.5 1 1 1 1\n 0.25 1 1 0").find("truncated"), std::string::npos);
  EXPECT_NE(error_of(head + " nan 1 1 1 1\n").find("t.fcidump:2: the value 'nan' is not finite"), std::string::npos);
  EXPECT_NE(error_of(head + " 0.5 1 1 1 1\n 0.5 3 1 1 1\n").find("t.fcidump:3: orbital index 3 is outside 0..NORB=2"),
            std::string::npos);
  EXPECT_NE(error_of(head + " 0.5 1 0 1 0\n").find("none of the FCIDUMP kinds"), std::string::npos);
  EXPECT_NE(error_of(head + " 0.5x 1 1 1 1\n").find("'0.5x' is not a number"), std::string::npos);
  EXPECT_NE(error_of("&FCI NORB=2,NELEC=2,MS2=0,UHF=.TRUE. &END\n 0.5 1 1 1 1\n").find("t.fcidump:1: UHF=.TRUE."),
            std::string::npos);
  EXPECT_NE(error_of("&FCI NORB=65,NELEC=2,MS2=0 &END\n 0.5 1 1 1 1\n").find("more than 64 orbitals per spin"),
            std::string::npos);
  EXPECT_NE(error_of("&FCI NORB=4,NELEC=3,MS2=0 &END\n 0.5 1 1 1 1\n").find("NELEC=3 and MS2=0"), std::string::npos);
  EXPECT_NE(error_of("&FCI NORB=2,NELEC=6,MS2=0 &END\n 0.5 1 1 1 1\n").find("3 alpha and 3 beta electrons into 2"),
            std::string::npos);
  EXPECT_NE(error_of("\n\n&FCI NORB=2,NELEC=2,\n MS2=0\n 0.5 1 1 1 1\n").find("t.fcidump:3: the namelist header has no end"),
            std::string::npos);
  EXPECT_NE(error_of("&FCI NELEC=2 &END\n 0.5 1 1 1 1\n").find("gives no NORB"), std::string::npos);
  EXPECT_NE(error_of("&FCI NORB=2,NELEC=2,ORBSYM=1 &END\n 0.5 1 1 1 1\n").find("ORBSYM has 1 labels; expected NORB=2"),
            std::string::npos);
  EXPECT_NE(error_of(head).find("no integrals"), std::string::npos);
  EXPECT_NE(error_of(" 0.5 1 1 1 1\n").find("does not start with a namelist '&FCI"), std::string::npos);
  EXPECT_NE(error_of(head + " 0.5 1 2 1 1\n 0.6 2 1 1 1\n").find("t.fcidump:3: 0.6 repeats the integral of line 2"),
            std::string::npos);
  EXPECT_EQ(error_of(head + " 0.5 1 2 1 1\n 0.50000000000001 1 1 2 1\n"), "");  // rounding: the first kept
  EXPECT_EQ(error_of(head + " 0.5 1 1 1 1\n"), "");
}

// Dice's test files: header values, the core energy (N2 at R = 2 bohr: 7 x 7 / 2 = 24.5
// hartree), and every integral line of the file found again through the packed arrays.
TEST(Fcidump, TheSharedTestFilesReadBackLineByLine) {
  struct Want {
    const char* file;
    int norb, nelec;
  };
  for (const Want& w : {Want{"N2_sto6g_FCIDUMP", 10, 14}, Want{"h10_sto6g_FCIDUMP", 10, 10},
                        Want{"H2H2_FCIDUMP_nosym", 6, 4}, Want{"h2o_FCIDUMP_symm", 4, 6}}) {
    const std::string path = data_file(w.file);
    const sci::Integrals r = sci::read_fcidump(path);
    EXPECT_EQ(r.norb, w.norb) << w.file;
    EXPECT_EQ(r.nelec, w.nelec) << w.file;
    EXPECT_EQ(r.ms2, 0) << w.file;
    if (std::string(w.file) == "N2_sto6g_FCIDUMP") EXPECT_EQ(r.core, 24.5);
    // Every line of the file, read here the simple way, is where the reader put it.
    std::ifstream in(path);
    std::string line;
    bool header = true;
    std::uint64_t lines = 0;
    while (std::getline(in, line)) {
      if (header) {
        header = line.find("&END") == std::string::npos && line.find('/') == std::string::npos;
        continue;
      }
      std::istringstream s(line);
      double v;
      int i, j, k, l;
      if (!(s >> v >> i >> j >> k >> l)) continue;
      ++lines;
      // (repeats in another order agree to rounding; the first one read is kept)
      if (i && j && k && l) EXPECT_NEAR(r.eri_at(l - 1, k - 1, j - 1, i - 1), v, 1e-12) << w.file << ": " << line;
      else if (i && j) EXPECT_NEAR(r.h1_at(j - 1, i - 1), v, 1e-12) << w.file << ": " << line;
      else if (!i) EXPECT_EQ(r.core, v) << w.file;
    }
    EXPECT_EQ(lines, r.integral_lines) << w.file;
  }
}

// unit/test_data.hpp: $QSTAGE_TEST_DATA, when set, is where the data is (the ctest
// unit.data_through_QSTAGE_TEST_DATA runs the FCIDUMP tests on a copy found that way).
TEST(TestData, FollowsQstageTestDataWhenSet) {
  const char* before = std::getenv("QSTAGE_TEST_DATA");
  const std::string saved = before ? before : "";
  setenv("QSTAGE_TEST_DATA", "/elsewhere/data", 1);
  EXPECT_EQ(qstage::testing::test_data("fcidump/x"), "/elsewhere/data/fcidump/x");
  unsetenv("QSTAGE_TEST_DATA");
  EXPECT_EQ(qstage::testing::test_data("fcidump/x"), std::string(QSTAGE_TEST_DATA_DEFAULT) + "/fcidump/x");
  if (before) setenv("QSTAGE_TEST_DATA", saved.c_str(), 1);
}
