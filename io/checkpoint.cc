#include "io/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "io/checkpoint_h5.h"

namespace shardgpt {

namespace fs = std::filesystem;
using h5::Id;

namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kIndexFormat = "shardgpt-checkpoint";
constexpr const char* kShardFormat = "shardgpt-checkpoint-shard";
constexpr const char* kIndexName = "index.h5";
constexpr const char* kLatestName = "latest";
constexpr uint64_t kChunkElems = uint64_t{1} << 20;  // 4 MiB chunks: Fletcher32 granularity
constexpr const char* kKinds[3] = {"master", "m", "v"};

bool fail_next_save = false;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string ShardFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.h5", rank);
  return buf;
}

std::string Errno() { return std::strerror(errno); }

Status FsyncPath(const std::string& p, bool dir) {
  const int fd = open(p.c_str(), O_RDONLY | (dir ? O_DIRECTORY : 0));
  if (fd < 0) return Status::IOError(p + ": cannot open for fsync: " + Errno());
  const int rc = fsync(fd);
  const std::string err = rc != 0 ? Errno() : "";
  close(fd);
  if (rc != 0) return Status::IOError(p + ": fsync failed: " + err);
  return Status::OK();
}

Status MakeStatus(int code, std::string msg) {
  switch (static_cast<Status::Code>(code)) {
    case Status::Code::kInvalidArgument: return Status::InvalidArgument(std::move(msg));
    case Status::Code::kNotFound: return Status::NotFound(std::move(msg));
    case Status::Code::kCorruption: return Status::Corruption(std::move(msg));
    case Status::Code::kIOError: return Status::IOError(std::move(msg));
    case Status::Code::kUnimplemented: return Status::Unimplemented(std::move(msg));
    default: return Status::Internal(std::move(msg));
  }
}

// ---- agreement over ranks ----

// Every rank returns an error when any rank has one, all with the message of the lowest
// failing rank (so whichever rank the caller prints from names the file).
Status AgreeAll(Communicator& comm, const Status& local) {
  if (comm.AllTrue(local.ok())) return Status::OK();
  const std::vector<uint64_t> failed = AllGatherU64(comm, {local.ok() ? 0u : 1u});
  int speaker = 0;
  while (speaker < comm.world_size() && failed[speaker] == 0) speaker++;
  if (speaker == comm.world_size()) return Status::Internal("checkpoint: communication failed");
  uint64_t hdr[2] = {0, 0};
  if (comm.rank() == speaker) hdr[0] = local.message().size(), hdr[1] = static_cast<uint64_t>(local.code());
  comm.ControlBroadcast(hdr, sizeof(hdr), speaker);
  std::vector<char> buf(hdr[0] + 1, '\0');
  if (comm.rank() == speaker) std::memcpy(buf.data(), local.message().data(), hdr[0]);
  comm.ControlBroadcast(buf.data(), buf.size(), speaker);
  return MakeStatus(static_cast<int>(hdr[1]), std::string(buf.data(), hdr[0]));
}

// ---- index records (compound datasets) ----

struct TensorRec {
  char name[96];
  int32_t unit;
  int32_t ndim;
  int64_t shape[4];
  int64_t offset;  // element offset inside the unit
  int64_t numel;
  char dtype[8];
};
struct UnitRec {
  char name[32];
  int64_t offset;  // element offset in the global flat buffer
  int64_t numel;
};
struct PieceRec {
  int32_t unit;
  int32_t file;
  int64_t begin, end, file_offset;
};
struct FileRec {
  char name[32];
  int64_t elements;
  int64_t bytes;
  uint32_t crc32c_master, crc32c_m, crc32c_v;
};

Id StrType(size_t n) {
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), n);
  H5Tset_strpad(t.get(), H5T_STR_NULLTERM);
  return t;
}

Id TensorType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(TensorRec)), H5Tclose);
  Id name = StrType(sizeof(TensorRec::name)), dtype = StrType(sizeof(TensorRec::dtype));
  const hsize_t four = 4;
  Id shape(H5Tarray_create2(H5T_NATIVE_INT64, 1, &four), H5Tclose);
  H5Tinsert(t.get(), "name", HOFFSET(TensorRec, name), name.get());
  H5Tinsert(t.get(), "unit", HOFFSET(TensorRec, unit), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "ndim", HOFFSET(TensorRec, ndim), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "shape", HOFFSET(TensorRec, shape), shape.get());
  H5Tinsert(t.get(), "offset", HOFFSET(TensorRec, offset), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "numel", HOFFSET(TensorRec, numel), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "dtype", HOFFSET(TensorRec, dtype), dtype.get());
  return t;
}
Id UnitType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(UnitRec)), H5Tclose);
  Id name = StrType(sizeof(UnitRec::name));
  H5Tinsert(t.get(), "name", HOFFSET(UnitRec, name), name.get());
  H5Tinsert(t.get(), "offset", HOFFSET(UnitRec, offset), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "numel", HOFFSET(UnitRec, numel), H5T_NATIVE_INT64);
  return t;
}
Id PieceType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(PieceRec)), H5Tclose);
  H5Tinsert(t.get(), "unit", HOFFSET(PieceRec, unit), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "file", HOFFSET(PieceRec, file), H5T_NATIVE_INT32);
  H5Tinsert(t.get(), "begin", HOFFSET(PieceRec, begin), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "end", HOFFSET(PieceRec, end), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "file_offset", HOFFSET(PieceRec, file_offset), H5T_NATIVE_INT64);
  return t;
}
Id FileType() {
  Id t(H5Tcreate(H5T_COMPOUND, sizeof(FileRec)), H5Tclose);
  Id name = StrType(sizeof(FileRec::name));
  H5Tinsert(t.get(), "name", HOFFSET(FileRec, name), name.get());
  H5Tinsert(t.get(), "elements", HOFFSET(FileRec, elements), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "bytes", HOFFSET(FileRec, bytes), H5T_NATIVE_INT64);
  H5Tinsert(t.get(), "crc32c_master", HOFFSET(FileRec, crc32c_master), H5T_NATIVE_UINT32);
  H5Tinsert(t.get(), "crc32c_m", HOFFSET(FileRec, crc32c_m), H5T_NATIVE_UINT32);
  H5Tinsert(t.get(), "crc32c_v", HOFFSET(FileRec, crc32c_v), H5T_NATIVE_UINT32);
  return t;
}

template <typename Rec>
bool WriteRecords(hid_t parent, const char* name, hid_t type, const std::vector<Rec>& recs) {
  const hsize_t n = recs.size();
  Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id dset(H5Dcreate2(parent, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  return dset.valid() && (n == 0 || H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, recs.data()) >= 0);
}

template <typename Rec>
bool ReadRecords(hid_t parent, const char* name, hid_t type, std::vector<Rec>* recs) {
  if (H5Lexists(parent, name, H5P_DEFAULT) <= 0) return false;
  Id dset(H5Dopen2(parent, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) return false;
  Id space(H5Dget_space(dset.get()), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1) return false;
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  if (n > (hsize_t{1} << 24)) return false;
  recs->assign(n, Rec{});
  if (n == 0) return true;
  if (H5Dread(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, recs->data()) < 0) return false;
  return true;
}

bool CopyName(char* dst, size_t cap, const std::string& s) {
  if (s.size() + 1 > cap) return false;
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), s.size());
  return true;
}
std::string FromName(const char* src, size_t cap) { return std::string(src, strnlen(src, cap)); }

// ---- shard files ----

struct ShardResult {
  uint64_t elements = 0, bytes = 0;
  uint32_t crc[3] = {0, 0, 0};
  double seconds = 0;
};

Status WriteShard(const std::string& path, int rank, int world, uint64_t id, int64_t step,
                  const std::vector<SavedPiece>& pieces, Engine& engine, ShardResult* out) {
  const double t0 = Now();
  uint64_t n = 0;
  for (const SavedPiece& p : pieces)
    if (p.file == rank) n = std::max(n, p.file_offset + (p.end - p.begin));
  Id file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return Status::IOError(path + ": cannot create: " + h5::LastError());
  bool ok = h5::WriteAttrStr(file.get(), "format", kShardFormat) && h5::WriteAttrU64(file.get(), "checkpoint_id", id) &&
            h5::WriteAttrI64(file.get(), "rank", rank) && h5::WriteAttrI64(file.get(), "world_size", world) &&
            h5::WriteAttrI64(file.get(), "step", step);
  if (!ok) return Status::IOError(path + ": cannot write attributes: " + h5::LastError());
  const hsize_t dims = n, chunk = std::min<uint64_t>(n, kChunkElems);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (n > 0) {  // a chunked dataset needs a non-zero chunk; an empty one stays contiguous
    H5Pset_chunk(dcpl.get(), 1, &chunk);
    H5Pset_fletcher32(dcpl.get());
  }
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every element is written once
  Id space(H5Screate_simple(1, &dims, nullptr), H5Sclose);
  // Chunks are assembled in one chunk-sized staging buffer (not a model copy) and written
  // pre-filtered with H5Dwrite_chunk: our vectorised Fletcher32 is appended, which is what
  // HDF5's filter would append (readers check it through the filter as usual). That skips
  // HDF5's chunk cache copy and its byte-at-a-time Fletcher32, which halved save speed.
  std::vector<float> staging(n > 0 ? chunk + 1 : 0);
  std::vector<const SavedPiece*> mine;
  for (const SavedPiece& p : pieces)
    if (p.file == rank) mine.push_back(&p);  // in file_offset order (PlanSave's order)
  for (int k = 0; k < 3; k++) {
    Id dset(H5Dcreate2(file.get(), kKinds[k], H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
            H5Dclose);
    if (!dset.valid()) return Status::IOError(path + ": cannot create dataset /" + kKinds[k] + ": " + h5::LastError());
    uint32_t crc = 0;
    size_t pi = 0;
    for (uint64_t lo = 0; lo < n; lo += chunk) {
      const uint64_t hi = std::min<uint64_t>(lo + chunk, n);
      for (uint64_t at = lo; at < hi;) {  // copy the pieces overlapping [lo, hi)
        while (mine[pi]->file_offset + (mine[pi]->end - mine[pi]->begin) <= at) pi++;
        const SavedPiece& p = *mine[pi];
        const Engine::OwnedState st = engine.Owned(p.unit);
        if (p.begin < st.begin || p.end > st.end)
          return Status::Internal("checkpoint: unit " + std::to_string(p.unit) + " piece not owned by rank " +
                                  std::to_string(rank));
        const float* base = k == 0 ? st.master : k == 1 ? st.m : st.v;
        const uint64_t unit_at = p.begin + (at - p.file_offset);  // stage 0: a sub-range of the full unit
        const uint64_t cnt = std::min<uint64_t>(hi, p.file_offset + (p.end - p.begin)) - at;
        engine.device().CopyToHost(&staging[at - lo], base + (unit_at - st.begin), cnt * sizeof(float));
        at += cnt;
      }
      std::fill(staging.begin() + (hi - lo), staging.begin() + chunk, 0.0f);  // the last chunk's tail
      crc = Crc32c(crc, staging.data(), (hi - lo) * sizeof(float));
      const uint32_t fl = Fletcher32(staging.data(), chunk * sizeof(float));
      uint8_t* tail = reinterpret_cast<uint8_t*>(&staging[chunk]);
      for (int b = 0; b < 4; b++) tail[b] = static_cast<uint8_t>(fl >> (8 * b));  // little-endian, as HDF5
      const hsize_t offset = lo;
      if (H5Dwrite_chunk(dset.get(), H5P_DEFAULT, 0, &offset, (chunk + 1) * sizeof(float), staging.data()) < 0)
        return Status::IOError(path + ": cannot write /" + kKinds[k] + ": " + h5::LastError());
    }
    if (!dset.Close()) return Status::IOError(path + ": cannot write /" + kKinds[k] + ": " + h5::LastError());
    out->crc[k] = crc;
  }
  if (!file.Close()) return Status::IOError(path + ": cannot close: " + h5::LastError());
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(path, false));
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) return Status::IOError(path + ": stat failed: " + Errno());
  out->elements = n;
  out->bytes = static_cast<uint64_t>(sb.st_size);
  out->seconds = Now() - t0;
  return Status::OK();
}

// Missing, truncated or resized shard files, named.
Status CheckFileSize(const std::string& path, uint64_t expected) {
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": shard file missing");
    return Status::IOError(path + ": " + Errno());
  }
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  if (size < expected)
    return Status::Corruption(path + ": truncated file (" + std::to_string(size) + " bytes, index says " +
                              std::to_string(expected) + ")");
  if (size != expected)
    return Status::Corruption(path + ": file size " + std::to_string(size) + " bytes, index says " +
                              std::to_string(expected));
  return Status::OK();
}

// An open shard file with its three datasets, checked against the index.
class ShardReader {
 public:
  Status Open(const std::string& path, const CheckpointIndex& idx, int file_no) {
    path_ = path;
    const CheckpointFile& f = idx.files[file_no];
    SHARDGPT_RETURN_IF_ERROR(CheckFileSize(path, f.bytes));
    file_ = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file_.valid()) return Status::Corruption(path + ": not a readable HDF5 file (" + h5::LastError() + ")");
    uint64_t id = 0;
    int64_t rank = -1;
    if (!h5::ReadAttrU64(file_.get(), "checkpoint_id", &id) || !h5::ReadAttrI64(file_.get(), "rank", &rank))
      return Status::Corruption(path + ": not a shardgpt shard file (no checkpoint_id/rank attributes)");
    if (id != idx.checkpoint_id || rank != file_no)
      return Status::Corruption(path + ": belongs to another checkpoint (id " + std::to_string(id) + " rank " +
                                std::to_string(rank) + ", index says id " + std::to_string(idx.checkpoint_id) +
                                " rank " + std::to_string(file_no) + ")");
    const uint64_t chunk = std::max<uint64_t>(1, std::min<uint64_t>(f.elements, kChunkElems));
    for (int k = 0; k < 3; k++) {
      if (H5Lexists(file_.get(), kKinds[k], H5P_DEFAULT) <= 0)
        return Status::Corruption(path + ": dataset /" + kKinds[k] + " missing");
      Id dapl = h5::ChunkCacheAccess(chunk * sizeof(float));
      dsets_[k] = Id(H5Dopen2(file_.get(), kKinds[k], dapl.get()), H5Dclose);
      if (!dsets_[k].valid())
        return Status::Corruption(path + ": cannot open dataset /" + kKinds[k] + ": " + h5::LastError());
      const int64_t len = h5::FloatDatasetLength(dsets_[k].get());
      if (len < 0 || static_cast<uint64_t>(len) != f.elements)
        return Status::Corruption(path + ": dataset /" + kKinds[k] + " has " + std::to_string(len) +
                                  " float elements, index says " + std::to_string(f.elements));
    }
    return Status::OK();
  }

  Status Read(int kind, uint64_t offset, uint64_t count, float* dst) {
    if (h5::ReadSlab(dsets_[kind].get(), offset, count, dst)) return Status::OK();
    const std::string err = h5::LastError();
    const std::string where = path_ + ": dataset /" + kKinds[kind] + " elements [" + std::to_string(offset) + ", " +
                              std::to_string(offset + count) + ")";
    if (err.find("Fletcher32") != std::string::npos || err.find("checksum") != std::string::npos)
      return Status::Corruption(where + ": checksum mismatch (" + err + ")");
    return Status::Corruption(where + ": read failed (" + err + ")");
  }

 private:
  std::string path_;
  Id file_;
  Id dsets_[3];
};

// Compares the index's layout table with this build's ParamLayout for the same config.
Status CheckLayout(const CheckpointIndex& idx, const ParamLayout& layout, const std::string& where) {
  if (std::string diff = idx.config.FirstDifference(layout.config()); !diff.empty())
    return Status::InvalidArgument(where + ": checkpoint is for another model config: " + diff +
                                   " (checkpoint vs this run)");
  const auto& ts = layout.tensors();
  if (idx.tensors.size() != ts.size() || idx.units.size() != layout.units().size())
    return Status::Corruption(where + ": parameter layout has " + std::to_string(idx.tensors.size()) + " tensors in " +
                              std::to_string(idx.units.size()) + " units, expected " + std::to_string(ts.size()) +
                              " in " + std::to_string(layout.units().size()));
  for (size_t i = 0; i < ts.size(); i++) {
    const TensorInfo& a = idx.tensors[i];
    if (a.name != ts[i].name || a.unit != ts[i].unit || a.offset != ts[i].offset || a.numel != ts[i].numel ||
        a.shape != ts[i].shape)
      return Status::Corruption(where + ": tensor " + std::to_string(i) + " '" + a.name +
                                "' differs from this build's parameter layout ('" + ts[i].name + "')");
  }
  for (size_t u = 0; u < layout.units().size(); u++)
    if (idx.units[u].numel != layout.units()[u].numel || idx.units[u].offset != layout.units()[u].offset)
      return Status::Corruption(where + ": unit " + std::to_string(u) + " differs from this build's layout");
  return Status::OK();
}

// ---- publishing ----

Status WriteIndex(const std::string& path, const CheckpointIndex& idx) {
  Id file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return Status::IOError(path + ": cannot create: " + h5::LastError());
  const hid_t f = file.get();
  bool ok = h5::WriteAttrStr(f, "format", kIndexFormat) && h5::WriteAttrI64(f, "format_version", kFormatVersion) &&
            h5::WriteAttrU64(f, "checkpoint_id", idx.checkpoint_id) &&
            h5::WriteAttrI64(f, "world_size", idx.world_size) && h5::WriteAttrI64(f, "zero_stage", idx.zero_stage) &&
            h5::WriteAttrStr(f, "dtype", idx.dtype) && h5::WriteAttrI64(f, "step", idx.state.step) &&
            h5::WriteAttrI64(f, "tokens", idx.state.tokens) &&
            h5::WriteAttrI64(f, "lr_schedule_position", idx.state.step) &&
            h5::WriteAttrI64(f, "adamw_t", idx.state.step) &&
            h5::WriteAttrU64(f, "loader_position", idx.state.loader_position) &&
            h5::WriteAttrU64(f, "seed", idx.state.seed) &&
            h5::WriteAttrStr(f, "rng", "derived: every random stream is a function of (seed, position)");
  Id config(H5Gcreate2(f, "config", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  const GPTConfig& c = idx.config;
  ok = ok && config.valid() && h5::WriteAttrI64(config.get(), "n_layer", c.n_layer) &&
       h5::WriteAttrI64(config.get(), "n_head", c.n_head) && h5::WriteAttrI64(config.get(), "n_embd", c.n_embd) &&
       h5::WriteAttrI64(config.get(), "max_seq_len", c.max_seq_len) &&
       h5::WriteAttrI64(config.get(), "vocab_size", c.vocab_size) &&
       h5::WriteAttrI64(config.get(), "padded_vocab_size", c.padded_vocab());
  std::vector<TensorRec> trecs;
  for (const TensorInfo& t : idx.tensors) {
    TensorRec r{};
    if (!CopyName(r.name, sizeof(r.name), t.name) || t.shape.size() > 4)
      return Status::Internal(path + ": tensor '" + t.name + "' does not fit the index record");
    r.unit = t.unit;
    r.ndim = static_cast<int32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); d++) r.shape[d] = t.shape[d];
    r.offset = static_cast<int64_t>(t.offset);
    r.numel = static_cast<int64_t>(t.numel);
    CopyName(r.dtype, sizeof(r.dtype), "f32");
    trecs.push_back(r);
  }
  std::vector<UnitRec> urecs;
  for (const UnitInfo& u : idx.units) {
    UnitRec r{};
    CopyName(r.name, sizeof(r.name), u.name);
    r.offset = static_cast<int64_t>(u.offset);
    r.numel = static_cast<int64_t>(u.numel);
    urecs.push_back(r);
  }
  std::vector<PieceRec> precs;
  for (const SavedPiece& p : idx.pieces)
    precs.push_back(PieceRec{p.unit, p.file, static_cast<int64_t>(p.begin), static_cast<int64_t>(p.end),
                             static_cast<int64_t>(p.file_offset)});
  std::vector<FileRec> frecs;
  for (const CheckpointFile& cf : idx.files) {
    FileRec r{};
    CopyName(r.name, sizeof(r.name), cf.name);
    r.elements = static_cast<int64_t>(cf.elements);
    r.bytes = static_cast<int64_t>(cf.bytes);
    r.crc32c_master = cf.crc_master;
    r.crc32c_m = cf.crc_m;
    r.crc32c_v = cf.crc_v;
    frecs.push_back(r);
  }
  Id layout(H5Gcreate2(f, "layout", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  Id plan(H5Gcreate2(f, "plan", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  ok = ok && layout.valid() && plan.valid() && WriteRecords(layout.get(), "tensors", TensorType().get(), trecs) &&
       WriteRecords(layout.get(), "units", UnitType().get(), urecs) &&
       WriteRecords(plan.get(), "pieces", PieceType().get(), precs) &&
       WriteRecords(plan.get(), "files", FileType().get(), frecs);
  if (!ok) return Status::IOError(path + ": cannot write the index: " + h5::LastError());
  config.Close();
  layout.Close();
  plan.Close();
  if (!file.Close()) return Status::IOError(path + ": cannot close: " + h5::LastError());
  return FsyncPath(path, false);
}

// Replaces `name` inside `dir` with a small text file atomically (temp file, fsync, rename).
Status WriteSmallFileAtomic(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/." + name + ".tmp", path = dir + "/" + name;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) return Status::IOError(tmp + ": cannot write");
  }
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(tmp, false));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::IOError(path + ": rename failed: " + Errno());
  return FsyncPath(dir, true);
}

// Moves a directory out of the way atomically, then deletes it: a crash mid-delete never
// leaves a step_* directory with an index but without some shard files.
void RemoveDirSafely(const std::string& dir, const std::string& path) {
  std::error_code ec;
  const std::string trash = dir + "/.trash." + fs::path(path).filename().string();
  fs::remove_all(trash, ec);
  if (std::rename(path.c_str(), trash.c_str()) == 0) fs::remove_all(trash, ec);
}

// Rank 0: moves the finished temp directory into place, points latest at it, prunes.
Status Publish(const std::string& dir, const std::string& tmp, const std::string& final_dir, const std::string& name,
               int keep_last) {
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(tmp, true));
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // Same step saved again (e.g. after a resume): swap atomically so the directory is
    // never missing, then delete the old one (now at tmp).
    if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      SHARDGPT_RETURN_IF_ERROR(FsyncPath(dir, true));
      fs::remove_all(tmp, ec);
    } else {
      RemoveDirSafely(dir, final_dir);
      if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
        return Status::IOError(final_dir + ": rename from " + tmp + " failed: " + Errno());
    }
  } else if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return Status::IOError(final_dir + ": rename from " + tmp + " failed: " + Errno());
  }
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(dir, true));
  SHARDGPT_RETURN_IF_ERROR(WriteSmallFileAtomic(dir, kLatestName, name + "\n"));
  if (keep_last > 0) {
    std::vector<std::pair<int64_t, std::string>> complete;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const int64_t s = ParseStepDirName(e.path().filename().string());
      if (s >= 0 && e.is_directory() && fs::exists(e.path() / kIndexName))
        complete.emplace_back(s, e.path().string());
    }
    std::sort(complete.rbegin(), complete.rend());
    int kept = 0;
    for (const auto& c : complete) {
      if (c.second == final_dir || kept < keep_last - 1) {
        if (c.second != final_dir) kept++;
        continue;
      }
      RemoveDirSafely(dir, c.second);
    }
    FsyncPath(dir, true);
  }
  return Status::OK();
}

// Rank 0, before a save: creates DIR, removes what crashed saves left behind, creates tmp.
Status PrepareSave(const std::string& dir, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) return Status::IOError(dir + ": cannot create the checkpoint directory");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp.", 0) == 0 || n.rfind(".trash.", 0) == 0) fs::remove_all(e.path(), ec);
  }
  if (!fs::create_directory(tmp, ec)) return Status::IOError(tmp + ": cannot create: " + ec.message());
  return Status::OK();
}

uint64_t RandomId() {
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (t * 0x9E3779B97F4A7C15ull)) | 1;
}

std::string Gbps(double bytes, double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", s > 0 ? bytes / s / 1e9 : 0.0);
  return buf;
}

std::string ReadLatest(const std::string& root, Status* st) {
  std::ifstream in(root + "/" + kLatestName);
  std::string name;
  if (!(in >> name)) *st = Status::Corruption(root + "/" + kLatestName + ": empty or unreadable");
  return name;
}

}  // namespace

uint64_t CheckpointIndex::total_bytes() const {
  uint64_t b = 0;
  for (const CheckpointFile& f : files) b += f.bytes;
  return b;
}

void FailNextSaveBeforeIndexForTesting() { fail_next_save = true; }

StatusOr<std::string> ResolveCheckpoint(const std::string& path, const std::string& ckpt_dir) {
  std::error_code ec;
  std::string root;
  if (path == kLatestName) {
    if (ckpt_dir.empty()) return Status::InvalidArgument("checkpoint 'latest' needs a checkpoint directory (--ckpt-dir)");
    root = ckpt_dir;
    if (!fs::is_directory(root, ec)) return Status::NotFound(root + ": no checkpoint directory");
  } else {
    if (!fs::exists(path, ec)) return Status::NotFound(path + ": no such checkpoint directory");
    if (fs::is_regular_file(path, ec) && fs::path(path).filename() == kIndexName)
      return fs::path(path).parent_path().string();
    if (!fs::is_directory(path, ec)) return Status::InvalidArgument(path + ": not a checkpoint directory");
    if (fs::exists(fs::path(path) / kIndexName, ec)) return path;
    if (!fs::exists(fs::path(path) / kLatestName, ec))
      return Status::InvalidArgument(path + ": not a checkpoint (no " + kIndexName + ")");
    root = path;
  }
  if (fs::exists(fs::path(root) / kLatestName, ec)) {
    Status st;
    const std::string name = ReadLatest(root, &st);
    if (!st.ok()) return st;
    const std::string dir = root + "/" + name;
    if (!fs::exists(fs::path(dir) / kIndexName, ec))
      return Status::Corruption(root + "/" + kLatestName + ": names " + name + ", which has no " + kIndexName);
    return dir;
  }
  // No latest file (a crash before the first one was written): the newest complete step.
  int64_t best = -1;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = ParseStepDirName(e.path().filename().string());
    if (s > best && fs::exists(e.path() / kIndexName)) best = s;
  }
  if (best < 0) return Status::NotFound(root + ": no checkpoint (no latest file, no complete step_* directory)");
  return root + "/" + StepDirName(best);
}

StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& checkpoint_dir) {
  h5::InitH5();
  const std::string path = checkpoint_dir + "/" + kIndexName;
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::InvalidArgument(checkpoint_dir + ": not a checkpoint (no index.h5)");
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return Status::Corruption(path + ": not a readable HDF5 file (" + h5::LastError() + ")");
  const hid_t f = file.get();
  CheckpointIndex idx;
  idx.dir = checkpoint_dir;
  std::string format;
  int64_t version = 0;
  if (!h5::ReadAttrStr(f, "format", &format) || format != kIndexFormat)
    return Status::Corruption(path + ": not a shardgpt checkpoint index (format attribute)");
  if (!h5::ReadAttrI64(f, "format_version", &version) || version != kFormatVersion)
    return Status::Unimplemented(path + ": format version " + std::to_string(version) + ", this build reads " +
                                 std::to_string(kFormatVersion));
  idx.format_version = static_cast<int>(version);
  int64_t world = 0, stage = 0;
  bool ok = h5::ReadAttrU64(f, "checkpoint_id", &idx.checkpoint_id) && h5::ReadAttrI64(f, "world_size", &world) &&
            h5::ReadAttrI64(f, "zero_stage", &stage) && h5::ReadAttrStr(f, "dtype", &idx.dtype) &&
            h5::ReadAttrI64(f, "step", &idx.state.step) && h5::ReadAttrI64(f, "tokens", &idx.state.tokens) &&
            h5::ReadAttrU64(f, "loader_position", &idx.state.loader_position) &&
            h5::ReadAttrU64(f, "seed", &idx.state.seed);
  if (!ok) return Status::Corruption(path + ": training state attributes missing");
  idx.world_size = static_cast<int>(world);
  idx.zero_stage = static_cast<int>(stage);
  if (H5Lexists(f, "config", H5P_DEFAULT) <= 0) return Status::Corruption(path + ": /config missing");
  {
    Id config(H5Gopen2(f, "config", H5P_DEFAULT), H5Gclose);
    int64_t v[5];
    const char* names[5] = {"n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size"};
    for (int i = 0; i < 5; i++)
      if (!h5::ReadAttrI64(config.get(), names[i], &v[i]))
        return Status::Corruption(path + ": /config attribute " + names[i] + " missing");
    idx.config.n_layer = static_cast<int>(v[0]);
    idx.config.n_head = static_cast<int>(v[1]);
    idx.config.n_embd = static_cast<int>(v[2]);
    idx.config.max_seq_len = static_cast<int>(v[3]);
    idx.config.vocab_size = static_cast<int>(v[4]);
  }
  std::vector<TensorRec> trecs;
  std::vector<UnitRec> urecs;
  std::vector<PieceRec> precs;
  std::vector<FileRec> frecs;
  if (H5Lexists(f, "layout", H5P_DEFAULT) <= 0 || H5Lexists(f, "plan", H5P_DEFAULT) <= 0)
    return Status::Corruption(path + ": /layout or /plan missing");
  {
    Id layout(H5Gopen2(f, "layout", H5P_DEFAULT), H5Gclose), plan(H5Gopen2(f, "plan", H5P_DEFAULT), H5Gclose);
    if (!ReadRecords(layout.get(), "tensors", TensorType().get(), &trecs) ||
        !ReadRecords(layout.get(), "units", UnitType().get(), &urecs) ||
        !ReadRecords(plan.get(), "pieces", PieceType().get(), &precs) ||
        !ReadRecords(plan.get(), "files", FileType().get(), &frecs))
      return Status::Corruption(path + ": cannot read the layout/plan tables (" + h5::LastError() + ")");
  }
  for (const TensorRec& r : trecs) {
    TensorInfo t;
    t.name = FromName(r.name, sizeof(r.name));
    t.unit = r.unit;
    if (r.ndim < 0 || r.ndim > 4) return Status::Corruption(path + ": tensor '" + t.name + "': bad ndim");
    t.shape.assign(r.shape, r.shape + r.ndim);
    t.offset = static_cast<size_t>(r.offset);
    t.numel = static_cast<size_t>(r.numel);
    idx.tensors.push_back(t);
  }
  std::vector<uint64_t> unit_numel;
  for (const UnitRec& r : urecs) {
    UnitInfo u;
    u.name = FromName(r.name, sizeof(r.name));
    u.offset = static_cast<size_t>(r.offset);
    u.numel = static_cast<size_t>(r.numel);
    unit_numel.push_back(u.numel);
    idx.units.push_back(u);
  }
  for (const PieceRec& r : precs)
    idx.pieces.push_back(SavedPiece{r.unit, r.file, static_cast<uint64_t>(r.begin), static_cast<uint64_t>(r.end),
                                    static_cast<uint64_t>(r.file_offset)});
  for (const FileRec& r : frecs)
    idx.files.push_back(CheckpointFile{FromName(r.name, sizeof(r.name)), static_cast<uint64_t>(r.elements),
                                       static_cast<uint64_t>(r.bytes), r.crc32c_master, r.crc32c_m, r.crc32c_v});
  if (idx.world_size < 1 || static_cast<int>(idx.files.size()) != idx.world_size)
    return Status::Corruption(path + ": " + std::to_string(idx.files.size()) + " shard files for world size " +
                              std::to_string(idx.world_size));
  if (Status st = CheckPieces(idx.pieces, unit_numel, idx.world_size); !st.ok())
    return Status::Corruption(path + ": sharding plan: " + st.message());
  const std::vector<uint64_t> elems = FileElements(idx.pieces, idx.world_size);
  for (int i = 0; i < idx.world_size; i++) {
    const std::string& n = idx.files[i].name;
    if (n.empty() || n.find('/') != std::string::npos || n == "..")
      return Status::Corruption(path + ": bad shard file name '" + n + "'");
    if (elems[i] != idx.files[i].elements)
      return Status::Corruption(path + ": shard file " + n + " holds " + std::to_string(idx.files[i].elements) +
                                " elements, the plan says " + std::to_string(elems[i]));
  }
  return idx;
}

StatusOr<GPTConfig> ReadCheckpointConfig(const std::string& path, const std::string& ckpt_dir) {
  auto dir = ResolveCheckpoint(path, ckpt_dir);
  if (!dir.ok()) return dir.status();
  auto idx = ReadCheckpointIndex(dir.value());
  if (!idx.ok()) return idx.status();
  return idx->config;
}

Status SaveCheckpoint(const std::string& dir, const TrainState& state, Engine& engine, const ParamLayout& layout,
                      Communicator& comm, int keep_last, bool quiet) {
  h5::InitH5();
  const double t_start = Now();
  const int rank = comm.rank(), world = comm.world_size();
  const std::string name = StepDirName(state.step);
  const std::string tmp = dir + "/.tmp." + name, final_dir = dir + "/" + name;

  uint64_t id[1] = {rank == 0 ? RandomId() : 0};
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, rank == 0 ? PrepareSave(dir, tmp) : Status::OK()));
  comm.ControlBroadcast(id, sizeof(id), 0);

  const std::vector<SavedPiece> pieces = PlanSave(layout, world);
  ShardResult res;
  const std::string shard_path = tmp + "/" + ShardFileName(rank);
  SHARDGPT_RETURN_IF_ERROR(
      AgreeAll(comm, WriteShard(shard_path, rank, world, id[0], state.step, pieces, engine, &res)));
  uint64_t secs_bits;
  std::memcpy(&secs_bits, &res.seconds, sizeof(double));
  const std::vector<uint64_t> all = AllGatherU64(
      comm, {res.elements, res.bytes, (uint64_t{res.crc[0]} << 32) | res.crc[1], res.crc[2], secs_bits});

  Status st;
  if (fail_next_save) {
    fail_next_save = false;
    st = Status::IOError(tmp + ": simulated crash before the index was written (test hook)");
  } else if (rank == 0) {
    CheckpointIndex idx;
    idx.format_version = kFormatVersion;
    idx.checkpoint_id = id[0];
    idx.config = layout.config();
    idx.tensors = layout.tensors();
    idx.units = layout.units();
    idx.world_size = world;
    idx.zero_stage = engine.options().zero_stage;
    idx.dtype = DTypeName(engine.options().dtype);
    idx.state = state;
    idx.pieces = pieces;
    for (int r = 0; r < world; r++) {
      const uint64_t* a = &all[5 * r];
      idx.files.push_back(CheckpointFile{ShardFileName(r), a[0], a[1], static_cast<uint32_t>(a[2] >> 32),
                                         static_cast<uint32_t>(a[2]), static_cast<uint32_t>(a[3])});
    }
    st = WriteIndex(tmp + "/" + kIndexName, idx);  // LAST: its presence marks the checkpoint complete
    if (st.ok()) st = Publish(dir, tmp, final_dir, name, keep_last);
  }
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, st));
  if (rank == 0 && !quiet) {
    const double wall = Now() - t_start;
    double total = 0;
    std::string per_rank;
    for (int r = 0; r < world; r++) {
      const uint64_t* a = &all[5 * r];
      double s;
      std::memcpy(&s, &a[4], sizeof(double));
      const double b = static_cast<double>(a[0]) * 3 * sizeof(float);
      total += b;
      per_rank += " " + Gbps(b, s);
    }
    std::printf("checkpoint: saved %s (%d file(s), %.3f GB of fp32 state) in %.3f s: %s GB/s total; per rank GB/s:%s\n",
                final_dir.c_str(), world, total / 1e9, wall, Gbps(total, wall).c_str(), per_rank.c_str());
    std::fflush(stdout);
  }
  return Status::OK();
}

StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm) {
  return LoadCheckpoint(path, ckpt_dir, engine, layout, comm, false);
}

StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm, bool quiet) {
  h5::InitH5();
  const double t_start = Now();
  // 1. Everything checkable without reading data, before the engine is touched.
  CheckpointIndex idx;
  Status st = [&]() -> Status {
    auto dir = ResolveCheckpoint(path, ckpt_dir);
    if (!dir.ok()) return dir.status();
    auto read = ReadCheckpointIndex(dir.value());
    if (!read.ok()) return read.status();
    idx = std::move(read.value());
    SHARDGPT_RETURN_IF_ERROR(CheckLayout(idx, layout, idx.dir + "/" + kIndexName));
    for (const CheckpointFile& f : idx.files) SHARDGPT_RETURN_IF_ERROR(CheckFileSize(idx.dir + "/" + f.name, f.bytes));
    return Status::OK();
  }();
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, st));

  // 2. What this rank reads: the saved pieces intersecting each Owned(u) range, by file.
  struct Job {
    ReadOp op;
    float* dst[3];
  };
  std::map<int, std::vector<Job>> by_file;
  for (int u = 0; u < layout.num_units(); u++) {
    const Engine::OwnedState own = engine.Owned(u);
    for (const ReadOp& op : PlanReads(idx.pieces, u, own.begin, own.end))
      by_file[op.file].push_back(Job{op, {own.master + op.dest_offset, own.m + op.dest_offset, own.v + op.dest_offset}});
  }
  // Open every needed file first (ids, dataset lengths), so a bad file fails before any data moves.
  std::map<int, ShardReader> readers;
  st = Status::OK();
  for (auto& [f, jobs] : by_file) {
    st = readers[f].Open(idx.dir + "/" + idx.files[f].name, idx, f);
    if (!st.ok()) break;
  }
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, st));

  // 3. Hyperslab reads straight into the engine's buffers (through host memory for a GPU).
  const double t_read = Now();
  uint64_t bytes = 0;
  Device& device = engine.device();
  std::vector<float> host;
  for (auto& [f, jobs] : by_file) {
    for (int k = 0; k < 3 && st.ok(); k++)
      for (const Job& j : jobs) {
        if (device.host_accessible()) {
          st = readers[f].Read(k, j.op.file_offset, j.op.count, j.dst[k]);
        } else {
          host.resize(j.op.count);
          st = readers[f].Read(k, j.op.file_offset, j.op.count, host.data());
          if (st.ok()) device.CopyToDevice(j.dst[k], host.data(), j.op.count * sizeof(float));
        }
        if (!st.ok()) break;
        bytes += j.op.count * sizeof(float);
      }
    readers.erase(f);  // close each file when done: bounded chunk caches
    if (!st.ok()) break;
  }
  const double read_s = Now() - t_read;
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, st));

  engine.set_step_count(idx.state.step);
  engine.SyncParamsFromMaster();
  uint64_t secs_bits;
  std::memcpy(&secs_bits, &read_s, sizeof(double));
  const std::vector<uint64_t> all = AllGatherU64(comm, {bytes, secs_bits});
  if (comm.rank() == 0 && !quiet) {
    const double wall = Now() - t_start;
    double total = 0;
    std::string per_rank;
    for (int r = 0; r < comm.world_size(); r++) {
      double s;
      std::memcpy(&s, &all[2 * r + 1], sizeof(double));
      total += static_cast<double>(all[2 * r]);
      per_rank += " " + Gbps(static_cast<double>(all[2 * r]), s);
    }
    std::printf("checkpoint: loaded %s (saved by %d rank(s), stage %d; step %lld) on %d rank(s), stage %d: %.3f GB "
                "read in %.3f s: %s GB/s total; per rank GB/s:%s\n",
                idx.dir.c_str(), idx.world_size, idx.zero_stage, static_cast<long long>(idx.state.step),
                comm.world_size(), engine.options().zero_stage, total / 1e9, wall, Gbps(total, wall).c_str(),
                per_rank.c_str());
    std::fflush(stdout);
  }
  return idx.state;
}

// The index of the checkpoint `path` names, checked against the layout its config implies
// (the common start of verify and of reading a full model without a training run).
static StatusOr<CheckpointIndex> OpenCheckedIndex(const std::string& path) {
  h5::InitH5();
  auto dir = ResolveCheckpoint(path, "");
  if (!dir.ok()) return dir.status();
  auto read = ReadCheckpointIndex(dir.value());
  if (!read.ok()) return read.status();
  const CheckpointIndex& idx = read.value();
  SHARDGPT_RETURN_IF_ERROR(idx.config.Validate());
  SHARDGPT_RETURN_IF_ERROR(CheckLayout(idx, ParamLayout(idx.config), idx.dir + "/" + kIndexName));
  return read;
}

Status VerifyCheckpoint(const std::string& path, CheckpointIndex* index, uint64_t* bytes_read) {
  auto read = OpenCheckedIndex(path);
  if (!read.ok()) return read.status();
  const CheckpointIndex& idx = read.value();
  uint64_t total = 0;
  std::vector<float> buf;
  for (size_t i = 0; i < idx.files.size(); i++) {
    const CheckpointFile& f = idx.files[i];
    const std::string p = idx.dir + "/" + f.name;
    ShardReader reader;
    SHARDGPT_RETURN_IF_ERROR(reader.Open(p, idx, static_cast<int>(i)));
    const uint32_t want[3] = {f.crc_master, f.crc_m, f.crc_v};
    for (int k = 0; k < 3; k++) {
      uint32_t crc = 0;
      for (uint64_t off = 0; off < f.elements; off += kChunkElems) {
        const uint64_t n = std::min<uint64_t>(kChunkElems, f.elements - off);
        buf.resize(n);
        SHARDGPT_RETURN_IF_ERROR(reader.Read(k, off, n, buf.data()));
        crc = Crc32c(crc, buf.data(), n * sizeof(float));
        total += n * sizeof(float);
      }
      if (crc != want[k]) {
        char msg[128];
        std::snprintf(msg, sizeof(msg), ": checksum mismatch in dataset /%s (CRC-32C %08x, index says %08x)",
                      kKinds[k], crc, want[k]);
        return Status::Corruption(p + msg);
      }
    }
  }
  if (index != nullptr) *index = idx;
  if (bytes_read != nullptr) *bytes_read = total;
  return Status::OK();
}

StatusOr<LlmcModel> LoadCheckpointFullModel(const std::string& path) {
  auto read = OpenCheckedIndex(path);
  if (!read.ok()) return read.status();
  const CheckpointIndex& idx = read.value();
  const ParamLayout layout(idx.config);
  LlmcModel model;
  model.config = idx.config;
  model.params.assign(layout.total_numel(), 0.0f);
  for (int f = 0; f < idx.world_size; f++) {
    ShardReader reader;
    SHARDGPT_RETURN_IF_ERROR(reader.Open(idx.dir + "/" + idx.files[f].name, idx, f));
    for (const SavedPiece& p : idx.pieces) {
      if (p.file != f) continue;
      float* dst = model.params.data() + layout.units()[p.unit].offset + p.begin;
      SHARDGPT_RETURN_IF_ERROR(reader.Read(0, p.file_offset, p.end - p.begin, dst));
    }
  }
  return model;
}

Status WriteFullModelH5(const std::string& path, const ParamLayout& layout, const float* params) {
  h5::InitH5();
  const std::string tmp = path + ".tmp";
  {
    Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) return Status::IOError(tmp + ": cannot create: " + h5::LastError());
    const GPTConfig& c = layout.config();
    bool ok = h5::WriteAttrStr(file.get(), "format", "shardgpt-model") &&
              h5::WriteAttrI64(file.get(), "n_layer", c.n_layer) && h5::WriteAttrI64(file.get(), "n_head", c.n_head) &&
              h5::WriteAttrI64(file.get(), "n_embd", c.n_embd) &&
              h5::WriteAttrI64(file.get(), "max_seq_len", c.max_seq_len) &&
              h5::WriteAttrI64(file.get(), "vocab_size", c.vocab_size) &&
              h5::WriteAttrI64(file.get(), "padded_vocab_size", c.padded_vocab());
    for (const TensorInfo& t : layout.tensors()) {
      if (!ok) break;
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
      Id dset(H5Dcreate2(file.get(), t.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                         H5P_DEFAULT),
              H5Dclose);
      const size_t global = layout.units()[t.unit].offset + t.offset;
      ok = dset.valid() &&
           H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, params + global) >= 0 &&
           h5::WriteAttrI64(dset.get(), "unit", t.unit) && h5::WriteAttrI64(dset.get(), "offset", global);
    }
    if (!ok) return Status::IOError(tmp + ": cannot write: " + h5::LastError());
    if (!file.Close()) return Status::IOError(tmp + ": cannot close: " + h5::LastError());
  }
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(tmp, false));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::IOError(path + ": rename failed: " + Errno());
  return Status::OK();
}

}  // namespace shardgpt
