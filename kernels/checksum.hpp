#pragma once
// qsum64: the checksum qstage stores with every output dataset. It is a sum, so any split of a
// dataset into batches and ranks gives the same value, and it needs no ordering between them:
//   view the dataset's bytes (C order, little endian) as words w_i (4 bytes; 1 byte for uint8),
//   qsum64 = sum over i of fmix64(w_i XOR ((i + 1) * 0x9e3779b97f4a7c15))   modulo 2^64.
// Changing any one word changes the sum (fmix64 is a bijection); moved words change it with
// overwhelming probability. docs/outputs.md has a ten-line numpy version.
#include <cstdint>

#include "backend/backend.hpp"
#include "kernels/common.hpp"

namespace qstage::kernels {

QSTAGE_HD std::uint64_t qsum_term(std::uint64_t word, std::uint64_t index) {
  return fmix64(word ^ ((index + 1) * kGolden));
}

struct Checksum {
  const void* data = nullptr;      // device memory (host memory on the cpu backend)
  std::uint64_t bytes = 0;         // a multiple of word_bytes
  unsigned word_bytes = 4;         // 4, or 1 for uint8 data
  std::uint64_t first_word = 0;    // global index of the first word
  std::uint64_t* result = nullptr; // device memory: receives the partial qsum64 of these words
};

void checksum(Stream& stream, const Checksum& args);
void checksum_cpu(const Checksum& args);

namespace detail {
void checksum_cuda(void* cuda_stream, const Checksum& args);
}

}  // namespace qstage::kernels
