#include "io/checkpoint_h5.h"

#include <vector>

namespace shardgpt {
namespace h5 {

void InitH5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
herr_t TakeFirst(unsigned, const H5E_error2_t* e, void* data) {
  auto* s = static_cast<std::string*>(data);
  if (!s->empty()) return 0;
  if (e->desc != nullptr && e->desc[0] != '\0') {
    *s = e->desc;
  } else {
    char minor[160] = {0};
    if (H5Eget_msg(e->min_num, nullptr, minor, sizeof(minor)) > 0) *s = minor;
  }
  return 0;
}
}  // namespace

// Every HDF5 call clears the error stack on entry, so a helper that must close handles after
// a failure saves the message here first.
thread_local std::string saved_error;

std::string LastError() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, TakeFirst, &s);
  H5Eclear2(H5E_DEFAULT);
  if (s.empty()) s = saved_error;
  saved_error.clear();
  return s.empty() ? "HDF5 error" : s;
}

namespace {
bool WriteAttr(hid_t obj, const char* name, hid_t type, const void* v) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  Id attr(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return attr.valid() && H5Awrite(attr.get(), type, v) >= 0;
}
// Reads a scalar 8-byte integer attribute of the given signedness: no conversion from
// another class or size, so a float or a narrower integer in a crafted file is refused
// rather than rounded or clipped into range.
bool ReadAttr(hid_t obj, const char* name, hid_t type, void* v) {
  if (H5Aexists(obj, name) <= 0) return false;
  Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  Id space(H5Aget_space(attr.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  Id ftype(H5Aget_type(attr.get()), H5Tclose);
  if (!ftype.valid() || H5Tget_class(ftype.get()) != H5T_INTEGER || H5Tget_size(ftype.get()) != 8 ||
      H5Tget_sign(ftype.get()) != H5Tget_sign(type))
    return false;
  return H5Aread(attr.get(), type, v) >= 0;
}
}  // namespace

bool WriteAttrI64(hid_t obj, const char* name, int64_t v) { return WriteAttr(obj, name, H5T_NATIVE_INT64, &v); }
bool WriteAttrU64(hid_t obj, const char* name, uint64_t v) { return WriteAttr(obj, name, H5T_NATIVE_UINT64, &v); }
bool ReadAttrI64(hid_t obj, const char* name, int64_t* v) { return ReadAttr(obj, name, H5T_NATIVE_INT64, v); }
bool ReadAttrU64(hid_t obj, const char* name, uint64_t* v) { return ReadAttr(obj, name, H5T_NATIVE_UINT64, v); }

bool WriteAttrStr(hid_t obj, const char* name, const std::string& v) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), v.empty() ? 1 : v.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  std::string buf = v.empty() ? std::string(1, '\0') : v;
  return WriteAttr(obj, name, type.get(), buf.data());
}

bool ReadAttrStr(hid_t obj, const char* name, std::string* v) {
  if (H5Aexists(obj, name) <= 0) return false;
  Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  Id ftype(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING || H5Tis_variable_str(ftype.get()) > 0) return false;
  const size_t n = H5Tget_size(ftype.get());
  if (n == 0 || n > (1u << 20)) return false;
  Id mtype(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mtype.get(), n);
  H5Tset_strpad(mtype.get(), H5T_STR_NULLPAD);
  std::vector<char> buf(n + 1, '\0');
  if (H5Aread(attr.get(), mtype.get(), buf.data()) < 0) return false;
  *v = std::string(buf.data());
  return true;
}

Id ChunkCacheAccess(size_t chunk_bytes) {
  Id dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  // 3 chunks: the one being filled plus room so a chunk is never evicted half-written (an
  // evicted partial chunk would be filtered, written, then read back and unfiltered again).
  H5Pset_chunk_cache(dapl.get(), 101, 3 * chunk_bytes + (1 << 16), 1.0);
  return dapl;
}

namespace {
bool Slab(hid_t dset, uint64_t offset, uint64_t count, void* buf, bool write) {
  if (count == 0) return true;
  Id fspace(H5Dget_space(dset), H5Sclose);
  const hsize_t start = offset, n = count;
  if (!fspace.valid() || H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr) < 0)
    return false;
  Id mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
  const bool ok = write ? H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, buf) >= 0
                        : H5Dread(dset, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, buf) >= 0;
  if (!ok) saved_error = LastError();  // before the handles close (which clears the stack)
  return ok;
}
}  // namespace

bool WriteSlab(hid_t dset, uint64_t offset, uint64_t count, const float* src) {
  return Slab(dset, offset, count, const_cast<float*>(src), true);
}
bool ReadSlab(hid_t dset, uint64_t offset, uint64_t count, float* dst) { return Slab(dset, offset, count, dst, false); }

int64_t FloatDatasetLength(hid_t dset) {
  Id type(H5Dget_type(dset), H5Tclose);
  if (!type.valid() || H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4) return -1;
  Id space(H5Dget_space(dset), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_ndims(space.get()) != 1) return -1;
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  return static_cast<int64_t>(n);
}

}  // namespace h5
}  // namespace shardgpt
