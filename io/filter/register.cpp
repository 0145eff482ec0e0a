// Registers qstage's filter with the HDF5 library qstage itself links (the plugin's class, built
// into the binary), so stages read and write compressed datasets without HDF5_PLUGIN_PATH.
#include <hdf5.h>

#include "io/filter/h5z_qstage.hpp"
#include "io/h5.hpp"

namespace qstage::h5z {

void register_filter() {
  // Registered unconditionally (HDF5 replaces a class of the same id): a plugin of another
  // qstage version on HDF5_PLUGIN_PATH must not decide what this binary writes.
  static const bool registered = [] {
    if (H5Zregister(filter_class()) < 0)
      throw h5::Error("H5Zregister", "", "filter 32881 (qstage codec)", "HDF5 refused the filter class");
    return true;
  }();
  (void)registered;
}

}  // namespace qstage::h5z
