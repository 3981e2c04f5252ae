// Small helpers over HDF5's C API for the checkpoint WRITERS: an owning handle, HDF5 errors as
// one line of text, attributes. Internal to ckpt/. shardgpt writes HDF5 (for h5py and h5dump)
// but never parses an HDF5 file it is given (ckpt/checkpoint_index.h says why). Every function
// returns errors as values and never lets HDF5 print (InitH5 silences its automatic error
// printing for the calling thread).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>

#include "base/status.h"
#include "model/config.h"

namespace shardgpt {
namespace h5 {

// Silences HDF5's automatic error printing (per thread in the thread-safe build) and, once
// per process before HDF5 initialises, turns off HDF5's atexit shutdown (H5dont_atexit): after
// a write failed on a full disk, H5Fclose can fail and leave the file in HDF5's table, and
// that shutdown would then crash inside exit (H5F__close_cb <- H5F_term_package). Every file is
// closed by its Id; the operating system releases the rest at exit. Cheap.
void InitH5();
// The innermost message of HDF5's error stack (e.g. "data error detected by Fletcher32
// checksum"), then clears the stack.
std::string LastError();

// What a failed write of `path` (`what`: "cannot write /master") says: on a full disk (errno
// or HDF5's error stack says ENOSPC) one line "no space left on device writing PATH, N bytes
// needed (M available)" with `needed` the file's expected size; else "PATH: what: <HDF5's
// message>". Clears HDF5's error stack.
Status WriteError(const std::string& path, const std::string& what, uint64_t needed);

// Reserves `bytes` of disk for the file at `path` (just created, nothing written yet) with
// fallocate(FALLOC_FL_KEEP_SIZE), so that a full disk is found before HDF5 writes a byte and
// fails half-way; the file's size stays HDF5's. A file system that cannot reserve
// (EOPNOTSUPP, EINVAL) is not an error: the writes then find a full disk themselves.
Status ReserveSpace(const std::string& path, uint64_t bytes);
// After the file is closed: frees the reserved blocks it did not use (a truncate to its size).
void ReleaseReserve(const std::string& path);

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer close) : id_(id), close_(close) {}
  Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      Close();
      std::swap(id_, o.id_);
      close_ = o.close_;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { Close(); }
  bool valid() const { return id_ >= 0; }
  hid_t get() const { return id_; }
  // Closes now; false if HDF5 reports an error (e.g. a failed flush of a file).
  bool Close() {
    bool ok = true;
    if (id_ >= 0 && close_ != nullptr) ok = close_(id_) >= 0;
    id_ = -1;
    return ok;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

bool WriteAttrI64(hid_t obj, const char* name, int64_t v);
bool WriteAttrU64(hid_t obj, const char* name, uint64_t v);
bool WriteAttrStr(hid_t obj, const char* name, const std::string& v);
bool WriteAttrF64(hid_t obj, const char* name, double v);
// A llama config's fields beside the common ones (arch "llama", n_kv_head, ffn_hidden,
// rope_theta, norm_eps, tie_embeddings); nothing for gpt2, whose files stay as they were.
bool WriteLlamaConfig(hid_t obj, const GPTConfig& c);

}  // namespace h5
}  // namespace shardgpt
