// The compression codec (codec/): the error bound on many kinds of input, every pipeline and
// block size; NaN and Inf kept exactly; deterministic bytes; refusal of damaged, truncated and
// foreign streams (a fuzz loop behind the checksum too); on a GPU, the same bytes from the GPU
// coder and the same values from the GPU decoder, also beyond 4 GiB.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec/block_coder.hpp"
#include "codec/block_math.hpp"
#include "codec/codec.hpp"
#include "codec/component.hpp"
#include "kernels/codec/backend_codec.hpp"
#include "test_util.hpp"

namespace qstage::codec {
namespace {

constexpr Pipeline kAll[] = {Pipeline::szx, Pipeline::threshold, Pipeline::group, Pipeline::group2l,
                             Pipeline::integrated, Pipeline::quantized};

struct Input {
  std::string name;
  std::vector<float> values;
};

// The kinds of data the issue names, each a few blocks long (with a partial last block).
std::vector<Input> inputs() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int n = 1000;
  std::vector<Input> in;
  auto make = [&](std::string name, const std::function<float(int)>& f) {
    Input x{std::move(name), std::vector<float>(n)};
    for (int i = 0; i < n; ++i) x.values[i] = f(i);
    in.push_back(std::move(x));
  };
  make("random", [&](int) { return normal(rng); });
  make("smooth", [&](int i) { return std::sin(0.01f * static_cast<float>(i)) + 3.0f; });
  make("spiky", [&](int i) {  // a circuit tensor's profile: mostly near zero, a few large values
    const float v = normal(rng);
    return i % 97 == 0 ? 50 * v : 1e-4f * v * std::exp(-0.01f * static_cast<float>(i % 200));
  });
  make("sparse", [&](int i) { return i % 131 == 5 ? normal(rng) : 0.0f; });
  make("all-zero", [&](int) { return 0.0f; });
  make("negative zeros", [&](int i) { return i % 2 ? -0.0f : 0.0f; });
  make("constant", [&](int) { return 2.5f; });
  make("denormals", [&](int i) {
    return std::numeric_limits<float>::denorm_min() * static_cast<float>((i * 7919) % 5000 - 2500);
  });
  make("huge", [&](int i) { return (i % 2 ? 3e38f : -3e38f) * uniform(rng); });
  // Adversarial: values exactly at the bound (0.01 with range 1: see the settings below), sign
  // flips at every block edge, and steps just past the threshold.
  make("at the bound", [&](int i) { return (i % 64 == 0 ? -1.0f : 1.0f) * (i % 3 == 0 ? 0.01f : 0.0100001f); });
  make("sign flips at block edges", [&](int i) { return (i / 64) % 2 ? 0.5f : -0.5f; });
  make("full range", [&](int i) { return i == 0 ? 1.0f : (i == 1 ? 0.0f : uniform(rng) * 0.5f + 0.5f); });
  return in;
}

// |decoded - original| within the guarantee for every component (exact double comparisons).
void expect_within_bound(const std::vector<float>& x, const std::vector<float>& y, const StreamInfo& info,
                         const std::string& what) {
  ASSERT_EQ(x.size(), y.size()) << what;
  const double t = info.pipeline == Pipeline::szx ? -1.0 : info.threshold;
  int reported = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      std::uint32_t a, b;
      std::memcpy(&a, &x[i], 4);
      std::memcpy(&b, &y[i], 4);
      EXPECT_EQ(a, b) << what << ": a non-finite value changed at " << i;
      continue;
    }
    const double bound = detail::allowed_error(x[i], t, info.error);
    const double err = std::abs(static_cast<double>(y[i]) - static_cast<double>(x[i]));
    if (!(err <= bound) && reported++ < 5)
      ADD_FAILURE() << what << ": value " << i << " was " << x[i] << ", decoded " << y[i] << ", error " << err
                    << " > bound " << bound;
  }
}

std::vector<float> round_trip(const std::vector<float>& x, const Settings& s, StreamInfo& info,
                              std::vector<std::uint8_t>* stream_out = nullptr) {
  const auto stream = encode(x.data(), ElementType::float32, {x.size()}, s);
  std::vector<float> y(x.size());
  info = decode(stream.data(), stream.size(), y.data(), y.size());
  if (stream_out) *stream_out = stream;
  return y;
}

TEST(Codec, EveryPipelineKeepsTheBoundOnEveryKindOfInput) {
  for (const auto& in : inputs())
    for (Pipeline p : kAll)
      for (std::uint32_t block : {64u, 128u, 256u})
        for (double bound : {1e-2, 1e-3, 0.0}) {
          Settings s{p, block, p == Pipeline::szx ? 0.0 : bound, bound, true};
          const std::string what = in.name + " / " + std::string(pipeline_name(p)) + " / block " +
                                   std::to_string(block) + " / bound " + std::to_string(bound);
          StreamInfo info;
          const auto y = round_trip(in.values, s, info);
          expect_within_bound(in.values, y, info, what);
          if (bound == 0.0)
            for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], in.values[i]) << what << " at " << i;
        }
}

// Values whose bits a lossless coding must keep although they compare equal to others or are
// not numbers: -0 alone, in whole blocks, beside +0 and among other values (at block edges too),
// NaN with payloads and of both signs, infinities, denormals and the extremes.
std::vector<float> bit_sensitive_values() {
  using detail::bits_float;
  const float nz = -0.0f;
  std::mt19937 rng(29);
  std::normal_distribution<float> normal;
  std::vector<float> x;
  x.insert(x.end(), 256, nz);                              // a block of -0 only
  for (int i = 0; i < 256; ++i) x.push_back(i % 3 ? 0.0f : nz);  // both zeros
  for (int i = 0; i < 256; ++i) x.push_back(i % 17 == 0 ? nz : (i % 5 ? 0.0f : normal(rng)));  // sparse with -0
  for (int i = 0; i < 256; ++i) x.push_back(i % 64 == 63 || i % 64 == 0 ? nz : normal(rng));  // -0 at block edges
  for (int i = 0; i < 256; ++i) x.push_back(i % 2 ? nz : 0.5f);  // -0 and a constant
  for (std::uint32_t w : {0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7f800001u, 0xff800001u, 0x7f800000u, 0xff800000u,
                          0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x80000000u})
    x.push_back(bits_float(w));
  for (int i = 0; i < 100; ++i) x.push_back(i % 2 ? bits_float(0x80000000u | static_cast<std::uint32_t>(i)) : nz);
  return x;
}

void expect_same_bits(const std::vector<float>& x, const std::vector<float>& y, const std::string& what) {
  ASSERT_EQ(x.size(), y.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (detail::float_bits(x[i]) != detail::float_bits(y[i]) && reported++ < 5)
      ADD_FAILURE() << what << ": value " << i << " had bits " << std::hex << detail::float_bits(x[i])
                    << ", decoded " << detail::float_bits(y[i]) << std::dec;
}

// docs/compression.md: e = 0 keeps every bit (with t = 0 for the pipelines that threshold), for
// float32 and complex64 data.
TEST(Codec, LosslessCodingKeepsEveryBitOfNegativeZerosNansAndDenormals) {
  const std::vector<float> x = bit_sensitive_values();
  for (Pipeline p : kAll)
    for (std::uint32_t block : {64u, 128u, 256u}) {
      const Settings s{p, block, 0.0, 0.0, true};
      const std::string what = std::string(pipeline_name(p)) + " / block " + std::to_string(block);
      StreamInfo info;
      expect_same_bits(x, round_trip(x, s, info), what);
      const auto stream = encode(x.data(), ElementType::complex64, {x.size() / 2}, s);
      std::vector<float> y(x.size());
      decode(stream.data(), stream.size(), y.data(), y.size());
      expect_same_bits(x, y, what + " / complex");
    }
}

TEST(Codec, AbsoluteBoundsAndThresholdLargerThanError) {
  const auto in = inputs();
  for (const auto& x : in)
    for (Pipeline p : {Pipeline::threshold, Pipeline::group, Pipeline::group2l, Pipeline::integrated}) {
      Settings s{p, 256, 0.05, 1e-4, false};
      StreamInfo info;
      const auto y = round_trip(x.values, s, info);
      EXPECT_EQ(info.threshold, 0.05);
      EXPECT_EQ(info.error, 1e-4);
      expect_within_bound(x.values, y, info, x.name + " / " + std::string(pipeline_name(p)));
    }
}

TEST(Codec, NonFiniteValuesComeBackExactlyAndDoNotWidenTheRange) {
  std::vector<float> x(300, 0.25f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[70] = std::numeric_limits<float>::infinity();
  x[71] = -std::numeric_limits<float>::infinity();
  x[200] = 0.75f;
  for (Pipeline p : kAll) {
    Settings s{p, 64, p == Pipeline::szx ? 0.0 : 1e-2, 1e-2, true};
    StreamInfo info;
    const auto y = round_trip(x, s, info);
    EXPECT_EQ(info.range, 0.5) << "the range ignores NaN and Inf";
    EXPECT_TRUE(std::isnan(y[3]));
    EXPECT_EQ(y[70], x[70]);
    EXPECT_EQ(y[71], x[71]);
    expect_within_bound(x, y, info, std::string(pipeline_name(p)));
  }
}

TEST(Codec, TinyAndEmptyArraysAndComplexData) {
  for (Pipeline p : kAll)
    for (size_t n : {0u, 1u, 2u, 63u, 64u, 65u}) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = 0.1f * static_cast<float>(i) - 1.0f;
      Settings s{p, 64, p == Pipeline::szx ? 0.0 : 1e-3, 1e-3, true};
      StreamInfo info;
      const auto y = round_trip(x, s, info);
      EXPECT_EQ(info.elements(), n);
      expect_within_bound(x, y, info, std::string(pipeline_name(p)) + " n=" + std::to_string(n));
    }
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> z(2 * 777);  // interleaved re, im
  for (auto& v : z) v = normal(rng) * (normal(rng) > 1.5f ? 1.0f : 1e-4f);
  for (Pipeline p : kAll) {
    Settings s{p, 128, p == Pipeline::szx ? 0.0 : 1e-3, 1e-3, true};
    const auto stream = encode(z.data(), ElementType::complex64, {7, 111}, s);
    std::vector<float> y(z.size());
    const StreamInfo info = decode(stream.data(), stream.size(), y.data(), y.size());
    EXPECT_EQ(info.type, ElementType::complex64);
    EXPECT_EQ(info.shape, (std::vector<std::uint64_t>{7, 111}));
    EXPECT_EQ(info.range, value_range(z.data(), z.size())) << "one range over both components";
    expect_within_bound(z, y, info, "complex " + std::string(pipeline_name(p)));
  }
}

TEST(Codec, SameInputSameBytesAndTheHeaderSaysWhatWasAsked) {
  const auto in = inputs();
  const auto& x = in[2].values;  // spiky
  for (Pipeline p : kAll) {
    Settings s{p, 128, p == Pipeline::szx ? 0.0 : 5e-3, 5e-3, true};
    const auto a = encode(x.data(), ElementType::float32, {x.size()}, s);
    const auto b = encode(x.data(), ElementType::float32, {x.size()}, s);
    EXPECT_EQ(a, b) << pipeline_name(p);
    const StreamInfo info = inspect(a.data(), a.size());
    EXPECT_EQ(info.version, kVersion);
    EXPECT_EQ(info.pipeline, p);
    EXPECT_EQ(info.block_size, 128u);
    EXPECT_TRUE(info.relative);
    EXPECT_EQ(info.error_given, 5e-3);
    EXPECT_EQ(info.error, 5e-3 * info.range);
    // A dataset range given by the caller (a chunk of a larger dataset) is what bounds scale with.
    const auto c = encode(x.data(), ElementType::float32, {x.size()}, s, 1000.0);
    EXPECT_EQ(inspect(c.data(), c.size()).error, 5.0);
  }
}

TEST(Codec, GroupingCompressesSparseDataFarBetterThanSzx) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> x(1 << 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 500 == 0 ? 1.0f : 1e-5f) * normal(rng);
  auto ratio = [&](Pipeline p) {
    const auto s = encode(x.data(), ElementType::float32, {x.size()},
                          Settings{p, 256, p == Pipeline::szx ? 0.0 : 1e-3, 1e-3, true});
    return 4.0 * static_cast<double>(x.size()) / static_cast<double>(s.size());
  };
  EXPECT_GT(ratio(Pipeline::group), 50);
  EXPECT_GT(ratio(Pipeline::group2l), 50);
  EXPECT_GT(ratio(Pipeline::integrated), 20);
  EXPECT_GT(ratio(Pipeline::group), 3 * ratio(Pipeline::szx));
  EXPECT_GT(ratio(Pipeline::quantized), 50);
}

// docs/compression.md: group and quantized sections open with the significance bitmap as a
// lossless part ([u8 codec][u64 raw bytes = n/8]...), group2l with its second level (n/64 bytes).
TEST(Codec, GroupingPipelinesStoreTheDocumentedBitmap) {
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 7 == 0 ? 1.0f : 0.0f;
  for (auto [p, raw] : {std::pair{Pipeline::group, 512u}, {Pipeline::quantized, 512u}, {Pipeline::group2l, 64u}}) {
    const auto s = encode(x.data(), ElementType::float32, {x.size()}, Settings{p, 256, 1e-3, 1e-3, true});
    std::uint64_t stored_raw = 0;
    std::memcpy(&stored_raw, s.data() + 72 + 8 + 8 + 1, 8);  // header, one extent, the section's size, codec
    EXPECT_EQ(stored_raw, raw) << pipeline_name(p);
  }
}

TEST(Codec, BadSettingsAreRefusedWithTheirName) {
  const std::vector<float> x(10, 1.0f);
  auto refused = [&](Settings s, const std::string& needle) {
    try {
      encode(x.data(), ElementType::float32, {x.size()}, s);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(Settings{Pipeline::integrated, 100, 0, 1e-3, true}, "block size 100");
  refused(Settings{Pipeline::integrated, 256, 0, -1, true}, "error bound");
  refused(Settings{Pipeline::integrated, 256, std::nan(""), 1e-3, true}, "threshold");
  refused(Settings{Pipeline::szx, 256, 1e-3, 1e-3, true}, "szx pipeline has no threshold");
  EXPECT_EQ(pipeline_from_name("group2l"), Pipeline::group2l);
  EXPECT_FALSE(pipeline_from_name("sz3"));
}

std::vector<std::uint8_t> sample_stream(Pipeline p) {
  std::vector<float> x(700);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 50 == 0 ? 1.0f : 1e-3f * std::sin(static_cast<float>(i));
  return encode(x.data(), ElementType::float32, {x.size()}, Settings{p, 64, p == Pipeline::szx ? 0.0 : 1e-2, 1e-3, true});
}

void expect_format_error(const std::vector<std::uint8_t>& s, const std::string& needle, const std::string& what) {
  std::vector<float> out(700);
  try {
    decode(s.data(), s.size(), out.data(), out.size());
    ADD_FAILURE() << what << ": decoded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
  }
}

TEST(Codec, ForeignTruncatedAndCorruptedStreamsAreRefused) {
  for (Pipeline p : kAll) {
    const auto good = sample_stream(p);
    auto other = good;
    other[4] = 2;  // version 2
    expect_format_error(other, "version 2", "version");
    other = good;
    other[0] = 'X';
    expect_format_error(other, "not a qstage compressed stream", "magic");
    for (size_t cut = 0; cut < good.size(); cut += (cut < 100 ? 1 : 37))
      expect_format_error(std::vector<std::uint8_t>(good.begin(), good.begin() + static_cast<long>(cut)), "", "truncated");
    std::mt19937 rng(5);
    for (int k = 0; k < 200; ++k) {
      auto bad = good;
      bad[rng() % bad.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      expect_format_error(bad, "", "one flipped bit");
    }
  }
}

// Streams whose meta moves 4 bytes of payload size from one block to another: the sizes still
// add up to the payload, but a zero, constant or raw block's payload then has a size its state
// does not allow, which the parser refuses before any decoder (CPU or GPU) runs. The blocks (of
// 64 values): all zero, constant, raw (a NaN in it), all zero.
std::vector<std::vector<std::uint8_t>> moved_size_streams() {
  std::vector<float> x(256, 0.0f);
  for (int i = 64; i < 128; ++i) x[i] = 0.5f;
  for (int i = 128; i < 192; ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  x[130] = std::numeric_limits<float>::quiet_NaN();
  const auto good = encode(x.data(), ElementType::float32, {x.size()}, Settings{Pipeline::integrated, 64, 0.0, 1e-3, false});
  detail::StoredComponent c;
  std::vector<float> ignored(x.size());
  detail::decode_with([&](const std::vector<detail::StoredComponent>& parts, const std::uint8_t*, std::uint64_t,
                          const detail::Coding&, float*) { c = parts.at(0); },
                      good.data(), good.size(), good.data(), ignored.data(), ignored.size());
  constexpr std::uint64_t kBlocks = 4;
  EXPECT_NE(c.meta_offset, detail::StoredComponent::kPacked);
  const std::uint8_t* states = good.data() + c.meta_offset;
  EXPECT_EQ(std::vector<int>(states, states + kBlocks), (std::vector<int>{detail::kZero, detail::kConstant, detail::kRaw, detail::kZero}));
  std::vector<std::vector<std::uint8_t>> out;
  for (auto [from, to] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{2, 3}}) {
    auto bad = good;
    auto add = [&](int b, int delta) {
      std::uint8_t* size = bad.data() + c.meta_offset + kBlocks + 2 * b;
      const int v = (size[0] | (size[1] << 8)) + delta;
      size[0] = static_cast<std::uint8_t>(v);
      size[1] = static_cast<std::uint8_t>(v >> 8);
    };
    add(from, -4);
    add(to, 4);
    reseal(bad);
    out.push_back(bad);
  }
  return out;
}

TEST(Codec, MovedBlockSizesAreRefused) {
  std::vector<float> out(256);
  int k = 0;
  for (const auto& bad : moved_size_streams()) {
    try {
      decode(bad.data(), bad.size(), out.data(), out.size());
      ADD_FAILURE() << "moved size " << k << ": decoded";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("which do not fit"), std::string::npos) << e.what();
    }
    ++k;
  }
}

// Behind the checksum: damaged payloads resealed with a valid checksum must still decode
// cleanly or be refused, never crash or write out of bounds (the ASan build checks the latter).
TEST(Codec, FuzzedPayloadsBehindAValidChecksumNeverCrash) {
  std::mt19937 rng(9);
  int refused = 0, decoded = 0;
  for (Pipeline p : kAll) {
    const auto good = sample_stream(p);
    const StreamInfo info = inspect(good.data(), good.size());
    const size_t header = 72 + 8 * info.shape.size();
    for (int k = 0; k < 3000; ++k) {
      auto bad = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bad[header + rng() % (bad.size() - header)] = static_cast<std::uint8_t>(rng());
      reseal(bad);
      std::vector<float> out(info.components());
      try {
        decode(bad.data(), bad.size(), out.data(), out.size());
        ++decoded;
      } catch (const FormatError&) {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, 1000);
  RecordProperty("decoded", decoded);
}

// The GPU tests thresholds and bounds in floats against the largest floats at or below t and
// max(t, e), which decides as the CPU's double comparisons only if they are exactly that.
TEST(Codec, FloatFormsOfTheBoundsAreTheLargestFloatsAtOrBelow) {
  constexpr double kMax = std::numeric_limits<float>::max();
  const double inf = std::numeric_limits<double>::infinity();
  for (double t : {-1.0, 0.0, 1e-3, 0.1, 1.0, 3.0, 1e-50, 1e-45, 1.4e-45, kMax, kMax * (1 + 1e-12), 1e300, inf})
    for (double e : {0.0, 1e-3, 0.1, 2.0}) {
      const auto r = detail::block_rules(t, e, true, true);
      const double te = std::max(t, e);
      for (auto [below, of] : {std::pair{r.t_below, t}, std::pair{r.te_below, te}}) {
        EXPECT_LE(static_cast<double>(below), of) << t << " " << e;
        const float next = std::nextafter(below, std::numeric_limits<float>::infinity());
        if (below != std::numeric_limits<float>::infinity())
          EXPECT_GT(static_cast<double>(next), of) << "not the largest float at or below " << of;
      }
    }
}

// ------------------------------------------------------------------------------ GPU

// The GPU codes every input as the CPU does, byte for byte, and each side decodes the other's
// stream to the same bits.
TEST(CodecGpu, SameBytesAsTheCpuAndEachDecodesTheOther) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  std::vector<Input> all = inputs();
  std::vector<float> z(2 * 777);  // complex, interleaved
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto& v : z) v = normal(rng) * (normal(rng) > 1.5f ? 1.0f : 1e-4f);
  all.push_back({"complex", z});
  // Complex blocks of every state (the GPU codes complex data as real/imaginary pairs at once):
  // zero, constant, sparse and dense blocks in the real part, others in the imaginary part.
  std::vector<float> mixed(2 * 1100, 0.0f);
  for (int i = 256; i < 512; ++i) mixed[2 * i] = 0.75f, mixed[2 * i + 1] = -0.25f;
  for (int i = 512; i < 1100; ++i) mixed[2 * i] = i % 17 == 0 ? normal(rng) : 0.0f, mixed[2 * i + 1] = normal(rng);
  all.push_back({"complex", mixed});
  all.push_back({"one value", {0.5f}});
  all.push_back({"empty", {}});
  for (const auto& in : all)
    for (Pipeline p : kAll)
      for (std::uint32_t block : {64u, 128u, 256u}) {
        const Settings s{p, block, p == Pipeline::szx ? 0.0 : 1e-3, 1e-3, true};
        const bool complex = in.name == "complex";
        const ElementType type = complex ? ElementType::complex64 : ElementType::float32;
        const std::vector<std::uint64_t> shape{in.values.size() / (complex ? 2 : 1)};
        const std::string what = in.name + " / " + std::string(pipeline_name(p)) + " / " + std::to_string(block);
        const auto cpu = encode(in.values.data(), type, shape, s);
        Buffer data = gpu.upload(in.values.data(), 4 * in.values.size());
        const auto on_gpu =
            kernels::codec_encode(*gpu.backend, *gpu.stream, static_cast<const float*>(data.data()), type, shape, s);
        ASSERT_EQ(on_gpu, cpu) << what;
        std::vector<float> by_cpu(in.values.size());
        decode(on_gpu.data(), on_gpu.size(), by_cpu.data(), by_cpu.size());
        Buffer stream = gpu.upload(cpu.data(), cpu.size());
        Buffer out = gpu.backend->alloc_device(4 * in.values.size() + 4, "test");
        kernels::codec_decode(*gpu.backend, *gpu.stream, cpu.data(), cpu.size(), static_cast<const std::uint8_t*>(stream.data()),
                              static_cast<float*>(out.data()), in.values.size());
        const auto by_gpu = gpu.download<float>(out, in.values.size());
        ASSERT_EQ(0, std::memcmp(by_cpu.data(), by_gpu.data(), 4 * by_cpu.size())) << what;
      }
}

// Where -0 must be kept (e = 0 and t = 0) and where it need not (e > 0, or t > 0), the GPU codes
// the bit-sensitive values as the CPU does, and decodes them to the same bits.
TEST(CodecGpu, NegativeZerosAndNansSameBytesAsTheCpu) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  const std::vector<float> x = bit_sensitive_values();
  Buffer data = gpu.upload(x.data(), 4 * x.size());
  Buffer out = gpu.backend->alloc_device(4 * x.size() + 4, "test");
  for (auto [t, e] : {std::pair{0.0, 0.0}, std::pair{0.0, 1e-3}, std::pair{1e-3, 0.0}, std::pair{1e-3, 1e-3}})
    for (Pipeline p : kAll)
      for (std::uint32_t block : {64u, 256u})
        for (bool complex : {false, true}) {
          if (p == Pipeline::szx && t > 0) continue;  // (szx has no threshold)
          const Settings s{p, block, t, e, false};
          const ElementType type = complex ? ElementType::complex64 : ElementType::float32;
          const std::vector<std::uint64_t> shape{x.size() / (complex ? 2 : 1)};
          const std::string what = std::string(pipeline_name(p)) + " t " + std::to_string(t) + " e " +
                                   std::to_string(e) + " / " + std::to_string(block) + (complex ? " / complex" : "");
          const auto cpu = encode(x.data(), type, shape, s);
          const auto on_gpu =
              kernels::codec_encode(*gpu.backend, *gpu.stream, static_cast<const float*>(data.data()), type, shape, s);
          ASSERT_EQ(on_gpu, cpu) << what;
          std::vector<float> by_cpu(x.size());
          decode(cpu.data(), cpu.size(), by_cpu.data(), by_cpu.size());
          Buffer stream = gpu.upload(cpu.data(), cpu.size());
          kernels::codec_decode(*gpu.backend, *gpu.stream, cpu.data(), cpu.size(),
                                static_cast<const std::uint8_t*>(stream.data()), static_cast<float*>(out.data()), x.size());
          expect_same_bits(by_cpu, gpu.download<float>(out, x.size()), what);
          if (t == 0 && e == 0) expect_same_bits(x, by_cpu, what);
        }
}

// The GPU finds its blocks' offsets by a look-back over tiles of 8 blocks, in the pass that
// codes them: over tens of thousands of tiles of mixed sizes (and past its window of 32 tiles),
// the stream is still the CPU's, byte for byte.
TEST(CodecGpu, ManyTilesSameBytesAsTheCpu) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  std::vector<float> x(2 * ((1u << 20) + 12345));
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t block = i / 512;  // runs of blocks: zero, constant, sparse, dense
    x[i] = block % 4 == 0 ? 0.0f : block % 4 == 1 ? 0.5f : block % 4 == 2 && i % 7 ? 0.0f : normal(rng);
  }
  Buffer data = gpu.upload(x.data(), 4 * x.size());
  for (Pipeline p : {Pipeline::szx, Pipeline::integrated, Pipeline::quantized})
    for (std::uint32_t block : {64u, 256u})
      for (bool complex : {false, true}) {
        const Settings s{p, block, p == Pipeline::szx ? 0.0 : 1e-3, 1e-3, true};
        const ElementType type = complex ? ElementType::complex64 : ElementType::float32;
        const std::vector<std::uint64_t> shape{x.size() / (complex ? 2 : 1)};
        const auto on_gpu =
            kernels::codec_encode(*gpu.backend, *gpu.stream, static_cast<const float*>(data.data()), type, shape, s);
        ASSERT_EQ(on_gpu, encode(x.data(), type, shape, s))
            << pipeline_name(p) << " / " << block << (complex ? " / complex" : "");
      }
}

// The GPU leaves out the checks that cannot fail and tests zero and constant blocks in floats
// (kernels/codec/choose.cuh, choose): on blocks built around those decisions' edges (spreads near 2 and
// 4 max(t, e), values near t and e, thresholds above and below the error bound, lossless), its
// bytes are still the CPU's.
TEST(CodecGpu, ShortcutsDecideAsTheCpu) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> pick(0, 7);
  for (auto [t, e] : {std::pair{1e-3, 1e-3}, std::pair{1e-2, 1e-4}, std::pair{1e-5, 1e-2}, std::pair{0.0, 0.0},
                      std::pair{3e-3, 0.0}}) {
    const double m = std::max(t, e) > 0 ? std::max(t, e) : 1e-6;
    std::vector<float> x(64 * 600);
    for (size_t b = 0; b < x.size() / 64; ++b) {
      const double spread[] = {0.5, 0.999, 1.0, 1.001, 2.0, 3.99, 4.0, 4.02};
      const double k = spread[pick(rng)], center = b % 3 == 0 ? 0.0 : u(rng) * 10 * m;
      for (int i = 0; i < 64; ++i) {
        const double v = b % 5 == 0 ? (i % 2 ? t : e) * (1 + 1e-7 * u(rng))  // near t and e
                                    : center + k * m * (i % 2 ? 1.0 : -1.0) * (i % 7 ? std::abs(u(rng)) : 1.0);
        x[64 * b + i] = static_cast<float>(v);
      }
    }
    Buffer data = gpu.upload(x.data(), 4 * x.size());
    for (Pipeline p : {Pipeline::szx, Pipeline::threshold, Pipeline::integrated, Pipeline::quantized})
      for (std::uint32_t block : {64u, 256u})
        for (bool complex : {false, true}) {
          const Settings s{p, block, p == Pipeline::szx ? 0.0 : t, e, false};
          if (p == Pipeline::quantized && e == 0) continue;  // (quantized needs e > 0)
          const ElementType type = complex ? ElementType::complex64 : ElementType::float32;
          const std::vector<std::uint64_t> shape{x.size() / (complex ? 2 : 1)};
          const auto on_gpu =
              kernels::codec_encode(*gpu.backend, *gpu.stream, static_cast<const float*>(data.data()), type, shape, s);
          ASSERT_EQ(on_gpu, encode(x.data(), type, shape, s))
              << pipeline_name(p) << " t " << t << " e " << e << " / " << block << (complex ? " / complex" : "");
        }
  }
}

TEST(CodecGpu, ResealedDamageIsRefusedOrDecodedLikeTheCpu) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  std::mt19937 rng(13);
  int refused = 0;
  for (Pipeline p : kAll) {
    const auto good = sample_stream(p);
    const StreamInfo info = inspect(good.data(), good.size());
    const size_t header = 72 + 8 * info.shape.size();
    Buffer out = gpu.backend->alloc_device(4 * info.components(), "test");
    for (int k = 0; k < 300; ++k) {
      auto bad = good;
      bad[header + rng() % (bad.size() - header)] = static_cast<std::uint8_t>(rng());
      reseal(bad);
      std::vector<float> cpu(info.components());
      bool cpu_ok = true, gpu_ok = true;
      try {
        decode(bad.data(), bad.size(), cpu.data(), cpu.size());
      } catch (const FormatError&) {
        cpu_ok = false;
      }
      Buffer stream = gpu.upload(bad.data(), bad.size());
      try {
        kernels::codec_decode(*gpu.backend, *gpu.stream, bad.data(), bad.size(),
                              static_cast<const std::uint8_t*>(stream.data()), static_cast<float*>(out.data()),
                              info.components());
      } catch (const FormatError&) {
        gpu_ok = false;
      }
      ASSERT_EQ(cpu_ok, gpu_ok) << pipeline_name(p) << " damage " << k;
      refused += !cpu_ok;
      if (cpu_ok) {  // equal bits, but any NaN for a NaN: damage can make mid + residual a NaN, whose
                     // bits x86 and CUDA choose differently (a valid stream never decodes to one it did not hold)
        const auto g = gpu.download<float>(out, info.components());
        for (size_t i = 0; i < cpu.size(); ++i)
          ASSERT_TRUE(std::isnan(g[i]) ? std::isnan(cpu[i]) : detail::float_bits(g[i]) == detail::float_bits(cpu[i]))
              << pipeline_name(p) << " damage " << k << " value " << i << ": " << g[i] << " vs " << cpu[i];
      }
    }
  }
  EXPECT_GT(refused, 100);
}

// 64-bit offsets: 1.2e9 values (4.8 GB) through the integrated pipeline on the GPU, decoded
// on the GPU within the bound and equal to the CPU's decoding of the same stream.
TEST(CodecGpu, InputsBeyondFourGiB) {
  REQUIRE_GPU();
  const std::uint64_t n = 1'200'000'000ull;
  test::GpuRun gpu(40ull << 30);
  std::vector<float> x(n);
  for (std::uint64_t i = 0; i < n; ++i)
    x[i] = i % 1000 == 0 ? static_cast<float>(i % 7) - 3.0f : 1e-6f * static_cast<float>(i % 13);
  x[n - 1] = 5.0f;  // past 4 GiB
  Buffer data = gpu.upload(x.data(), 4 * n);
  const Settings s{Pipeline::integrated, 256, 1e-3, 1e-3, true};
  const auto stream = kernels::codec_encode(*gpu.backend, *gpu.stream, static_cast<const float*>(data.data()),
                                            ElementType::float32, {n}, s);
  data = Buffer();
  Buffer device_stream = gpu.upload(stream.data(), stream.size());
  Buffer out = gpu.backend->alloc_device(4 * n, "test");
  const StreamInfo info = kernels::codec_decode(*gpu.backend, *gpu.stream, stream.data(), stream.size(),
                                                static_cast<const std::uint8_t*>(device_stream.data()),
                                                static_cast<float*>(out.data()), n);
  const auto y = gpu.download<float>(out, n);
  EXPECT_EQ(y[n - 1], 5.0f);
  expect_within_bound(x, y, info, "beyond 4 GiB");
  std::vector<float> cpu(n);
  decode(stream.data(), stream.size(), cpu.data(), n);
  EXPECT_EQ(0, std::memcmp(cpu.data(), y.data(), 4 * n));
}

}  // namespace
}  // namespace qstage::codec
