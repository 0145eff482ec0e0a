#pragma once
// qstage's HDF5 filter, id 32881: from the range 32768-65535 that HDF5 leaves for unregistered
// filters, until one is registered with The HDF Group. The plugin (libh5z_qstage.so, found
// through HDF5_PLUGIN_PATH) lets h5py, h5dump and h5repack read and write compressed datasets;
// qstage registers the same filter in its own process (register_filter), so its stages read
// them without the plugin.
//
// cd_values, layout version 1 (only writers need them; a stream is self-describing, so reading
// ignores them):
//   [0] layout version (1)   [1] element type: 0 float32, 1 complex64 (a pair of float32)
//   [2] pipeline: 0 szx, 1 threshold, 2 group, 3 group2l, 4 integrated, 5 quantized
//   [3] block size: 64, 128 or 256   [4] flags: bit 0 = t and e are relative to the chunk's range
//   [5] [6] threshold t, a double: low then high 32 bits   [7] [8] error bound e, likewise
#include <H5Ipublic.h>  // hid_t, which H5Zpublic.h uses without including
#include <H5Zpublic.h>

#include <cstddef>
#include <vector>

#include "codec/codec.hpp"

namespace qstage::h5z {

constexpr H5Z_filter_t kFilterId = 32881;
constexpr std::size_t kCdValues = 9;
constexpr unsigned kLayoutVersion = 1;
constexpr unsigned kRelative = 1u;

// The filter class (h5z_filter.cpp; it calls no HDF5 function).
const H5Z_class2_t* filter_class();

// The cd_values that ask the filter for these settings.
std::vector<unsigned> cd_values(codec::ElementType type, const codec::Settings& s);

// Registers the filter with the HDF5 qstage runs on (idempotent); throws h5::Error on failure.
void register_filter();

}  // namespace qstage::h5z
