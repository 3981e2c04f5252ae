#include "ckpt/checkpoint_h5.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace shardgpt {
namespace h5 {

void InitH5() {
  static std::once_flag once;
  std::call_once(once, [] { H5dont_atexit(); });
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

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
// Walks the whole stack (LastError keeps only the innermost message): HDF5's POSIX driver
// records the failing write's errno in the text ("errno = 28, error message = 'No space left
// on device'").
herr_t FindNoSpace(unsigned, const H5E_error2_t* e, void* data) {
  if (e->desc != nullptr && std::strstr(e->desc, std::strerror(ENOSPC)) != nullptr) *static_cast<bool*>(data) = true;
  return 0;
}

// "1,234,567": byte counts people read
std::string Grouped(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

Status NoSpace(const std::string& path, uint64_t needed) {
  std::string msg = "no space left on device writing " + path + ", " + Grouped(needed) + " bytes needed";
  struct statvfs vs {};
  if (::statvfs(DirOf(path).c_str(), &vs) == 0)
    msg += " (" + Grouped(static_cast<uint64_t>(vs.f_bavail) * vs.f_frsize) + " available)";
  return Status::IOError(msg);
}
}  // namespace

Status WriteError(const std::string& path, const std::string& what, uint64_t needed) {
  const int err = errno;
  bool no_space = err == ENOSPC;
  if (!no_space) H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, FindNoSpace, &no_space);
  if (no_space) {
    H5Eclear2(H5E_DEFAULT);
    return NoSpace(path, needed);
  }
  return Status::IOError(path + ": " + what + ": " + LastError());
}

Status ReserveSpace(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": cannot open to reserve space: " + std::strerror(errno));
  // KEEP_SIZE: the file's size stays what HDF5 writes (HDF5 caches its end of file and would
  // not truncate a file grown behind its back); ReleaseReserve frees what is left unused
  const int rc = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  ::close(fd);
  if (rc == ENOSPC || rc == EDQUOT) return NoSpace(path, bytes);
  return Status::OK();
}

void ReleaseReserve(const std::string& path) {
  struct stat sb {};
  // a truncate to the same size drops the blocks reserved past the end (ext4, tmpfs)
  if (::stat(path.c_str(), &sb) == 0) (void)::truncate(path.c_str(), sb.st_size);
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

bool WriteAttrF64(hid_t obj, const char* name, double v) { return WriteAttr(obj, name, H5T_NATIVE_DOUBLE, &v); }

bool WriteLlamaConfig(hid_t obj, const GPTConfig& c) {
  if (!c.llama()) return true;
  return WriteAttrStr(obj, "arch", "llama") && WriteAttrI64(obj, "n_kv_head", c.kv_heads()) &&
         WriteAttrI64(obj, "ffn_hidden", c.ffn()) && WriteAttrF64(obj, "rope_theta", c.rope_theta) &&
         WriteAttrF64(obj, "norm_eps", c.norm_eps) && WriteAttrI64(obj, "tie_embeddings", c.tie_embeddings ? 1 : 0);
}

}  // namespace h5
}  // namespace shardgpt
