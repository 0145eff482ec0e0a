#pragma once
// Datasets of qstage-codec chunks (HDF5 filter 32881) written from a spool file.
//
// Compressed chunks have sizes known only once coded, and parallel HDF5 1.10 cannot write them
// from several ranks (uncoordinated direct chunk writes silently misplace chunks). So whoever
// makes them - the `compress` stage, or the engine for any step's compressed outputs - appends
// the coded chunks in order to a ChunkSpool on rank 0, made durable at every checkpoint, and
// rank 0 alone writes them into the finished output with write_compressed_dataset.
//
// Also here: the codec settings a spec gives (a stage's parameters or a step's compress_output)
// and the summary that becomes provenance and the dataset's codec.* attributes.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "io/h5.hpp"

namespace qstage::h5 {

// The codec settings in `spec` (pipeline, block_size, error, threshold, bounds), checked.
// bounds "relative" and "chunk" both make relative settings (fractions of a range); threshold
// defaults to error. Throws InputError naming `where` and the bad setting.
codec::Settings codec_settings(const nlohmann::json& spec, std::string_view where);

// The settings as provenance and attributes: given and absolute bounds (absolute ones null when
// relative bounds have no range yet), the range, the element type.
nlohmann::json codec_summary(const codec::Settings& s, std::optional<double> range, codec::ElementType type,
                             std::string_view bounds_name = {});

// The float32 / complex64 of a dataset type, or nullopt for other types.
std::optional<codec::ElementType> codec_element_type(DType t);

// An append-only file of coded chunks, in chunk order. Its committed state (length and chunk
// sizes) goes into a step's journal; a resumed writer first cuts the file back to that state,
// dropping what an interrupted run appended after its last checkpoint.
class ChunkSpool {
 public:
  struct State {
    std::uint64_t bytes = 0;
    std::vector<std::uint64_t> sizes;
    std::string serialize() const;                         // binary
    static State deserialize(const std::string& bytes);    // throws std::runtime_error if malformed
  };

  ChunkSpool() = default;
  explicit ChunkSpool(std::filesystem::path path) : path_(std::move(path)) {}
  ChunkSpool(const ChunkSpool&) = delete;
  ChunkSpool& operator=(const ChunkSpool&) = delete;
  ~ChunkSpool();

  void set_path(std::filesystem::path path) { path_ = std::move(path); }
  const std::filesystem::path& path() const { return path_; }
  // Appends one chunk's stream.
  void append(const std::byte* data, std::uint64_t size);
  // Makes everything appended durable (the file exists afterwards, even if empty).
  State commit() const;
  // Continues from a committed state (the next append cuts the file back to it).
  void restore(State state);
  const State& state() const { return state_; }

 private:
  void open_for_append() const;
  [[noreturn]] void fail(const char* what) const;

  std::filesystem::path path_;
  mutable int fd_ = -1;
  State state_;
};

// Creates dataset `name` of `layout` (chunked) in `file` (opened serially) with filter 32881 and the `filter` settings
// as its cd_values, writes the spool's chunks in order as its chunks, and sets the codec.*
// attributes from `summary`, codec.stored_bytes, stored_xxh64 and a description. Returns the
// XXH64 of the stored bytes in order, as hex (the dataset's checksum for the manifest).
std::string write_compressed_dataset(File& file, const std::string& name, const Layout& layout,
                                     const codec::Settings& filter, const nlohmann::json& summary,
                                     const ChunkSpool& spool);

}  // namespace qstage::h5
