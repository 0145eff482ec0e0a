// libh5z_qstage.so: HDF5 loads it from HDF5_PLUGIN_PATH, so h5py, h5dump and h5repack read and
// write qstage's compressed chunks. The filter itself is in h5z_filter.cpp.
//
// The plugin calls no HDF5 function and does not link libhdf5: it only uses HDF5's header types.
// The HDF5 that loads it (Debian's serial one under h5py and the tools) is the only one in the
// process; a second libhdf5 would have its own global state.
#include <H5PLextern.h>

#include "io/filter/h5z_qstage.hpp"

// HDF5's two entry points (found with dlsym), the only symbols the plugin exports.
extern "C" {
__attribute__((visibility("default"))) H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
__attribute__((visibility("default"))) const void* H5PLget_plugin_info(void) { return qstage::h5z::filter_class(); }
}
