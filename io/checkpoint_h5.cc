#include "io/checkpoint_h5.h"

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

std::string LastError() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, TakeFirst, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? "HDF5 error" : s;
}

namespace {
bool WriteAttr(hid_t obj, const char* name, hid_t type, const void* v) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  Id attr(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return attr.valid() && H5Awrite(attr.get(), type, v) >= 0;
}
}  // namespace

bool WriteAttrI64(hid_t obj, const char* name, int64_t v) { return WriteAttr(obj, name, H5T_NATIVE_INT64, &v); }
bool WriteAttrU64(hid_t obj, const char* name, uint64_t v) { return WriteAttr(obj, name, H5T_NATIVE_UINT64, &v); }

bool WriteAttrStr(hid_t obj, const char* name, const std::string& v) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), v.empty() ? 1 : v.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  std::string buf = v.empty() ? std::string(1, '\0') : v;
  return WriteAttr(obj, name, type.get(), buf.data());
}

}  // namespace h5
}  // namespace shardgpt
