#include "io/checkpoint_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "io/checkpoint_plan.h"

namespace shardgpt {

using h5::Id;

const char* const kShardKinds[3] = {"master", "m", "v"};

namespace {

constexpr const char* kShardFormat = "shardgpt-checkpoint-shard";

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status FsyncFile(const std::string& p) {
  const int fd = open(p.c_str(), O_RDONLY);
  if (fd < 0) return Status::IOError(p + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = fsync(fd);
  const std::string err = rc != 0 ? std::strerror(errno) : "";
  close(fd);
  if (rc != 0) return Status::IOError(p + ": fsync failed: " + err);
  return Status::OK();
}

}  // namespace

Status WriteShardFile(const std::string& path, int rank, int world, uint64_t checkpoint_id, int64_t step,
                      uint64_t n, const ShardFill& fill, ShardWriteResult* out) {
  h5::InitH5();
  const double t0 = Now();
  Id file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return Status::IOError(path + ": cannot create: " + h5::LastError());
  bool ok = h5::WriteAttrStr(file.get(), "format", kShardFormat) &&
            h5::WriteAttrU64(file.get(), "checkpoint_id", checkpoint_id) &&
            h5::WriteAttrI64(file.get(), "rank", rank) && h5::WriteAttrI64(file.get(), "world_size", world) &&
            h5::WriteAttrI64(file.get(), "step", step);
  if (!ok) return Status::IOError(path + ": cannot write attributes: " + h5::LastError());
  const hsize_t dims = n, chunk = std::min<uint64_t>(n, kShardChunkElems);
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
  for (int k = 0; k < 3; k++) {
    Id dset(H5Dcreate2(file.get(), kShardKinds[k], H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
    if (!dset.valid())
      return Status::IOError(path + ": cannot create dataset /" + kShardKinds[k] + ": " + h5::LastError());
    uint32_t crc = 0;
    for (uint64_t lo = 0; lo < n; lo += chunk) {
      const uint64_t hi = std::min<uint64_t>(lo + chunk, n);
      SHARDGPT_RETURN_IF_ERROR(fill(k, lo, hi - lo, staging.data()));
      std::fill(staging.begin() + (hi - lo), staging.begin() + chunk, 0.0f);  // the last chunk's tail
      crc = Crc32c(crc, staging.data(), (hi - lo) * sizeof(float));
      const uint32_t fl = Fletcher32(staging.data(), chunk * sizeof(float));
      uint8_t* tail = reinterpret_cast<uint8_t*>(&staging[chunk]);
      for (int b = 0; b < 4; b++) tail[b] = static_cast<uint8_t>(fl >> (8 * b));  // little-endian, as HDF5
      const hsize_t offset = lo;
      if (H5Dwrite_chunk(dset.get(), H5P_DEFAULT, 0, &offset, (chunk + 1) * sizeof(float), staging.data()) < 0)
        return Status::IOError(path + ": cannot write /" + kShardKinds[k] + ": " + h5::LastError());
    }
    if (!dset.Close()) return Status::IOError(path + ": cannot write /" + kShardKinds[k] + ": " + h5::LastError());
    out->crc[k] = crc;
  }
  if (!file.Close()) return Status::IOError(path + ": cannot close: " + h5::LastError());
  SHARDGPT_RETURN_IF_ERROR(FsyncFile(path));
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) return Status::IOError(path + ": stat failed: " + std::strerror(errno));
  out->elements = n;
  out->bytes = static_cast<uint64_t>(sb.st_size);
  out->seconds = Now() - t0;
  return Status::OK();
}

Status CheckShardFileSize(const std::string& path, uint64_t expected) {
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": shard file missing");
    return Status::IOError(path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) return Status::Corruption(path + ": not a regular file (expected a shard file)");
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  if (size < expected)
    return Status::Corruption(path + ": truncated file (" + std::to_string(size) + " bytes, index says " +
                              std::to_string(expected) + ")");
  if (size != expected)
    return Status::Corruption(path + ": file size " + std::to_string(size) + " bytes, index says " +
                              std::to_string(expected));
  return Status::OK();
}

Status ShardFileReader::Open(const std::string& path, const CheckpointIndex& idx, int file_no) {
  h5::InitH5();
  path_ = path;
  if (file_no < 0 || static_cast<size_t>(file_no) >= idx.files.size())
    return Status::Internal(path + ": file " + std::to_string(file_no) + " is not in the index");
  const CheckpointFile& f = idx.files[file_no];
  elements_ = f.elements;
  file_bytes_ = f.bytes;
  SHARDGPT_RETURN_IF_ERROR(CheckShardFileSize(path, f.bytes));
  file_ = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_.valid()) return Status::Corruption(path + ": not a readable HDF5 file (" + h5::LastError() + ")");
  uint64_t id = 0;
  int64_t rank = -1, world = -1;
  if (!h5::ReadAttrU64(file_.get(), "checkpoint_id", &id) || !h5::ReadAttrI64(file_.get(), "rank", &rank) ||
      !h5::ReadAttrI64(file_.get(), "world_size", &world))
    return Status::Corruption(path + ": not a shardgpt shard file (no checkpoint_id/rank/world_size attributes)");
  if (id != idx.checkpoint_id || rank != file_no || world != idx.world_size)
    return Status::Corruption(path + ": belongs to another checkpoint (id " + std::to_string(id) + " rank " +
                              std::to_string(rank) + " of " + std::to_string(world) + ", index says id " +
                              std::to_string(idx.checkpoint_id) + " rank " + std::to_string(file_no) + " of " +
                              std::to_string(idx.world_size) + ")");
  chunk_ = std::max<uint64_t>(1, std::min<uint64_t>(f.elements, kShardChunkElems));
  for (int k = 0; k < 3; k++) {
    const std::string what = path + ": dataset /" + kShardKinds[k];
    if (H5Lexists(file_.get(), kShardKinds[k], H5P_DEFAULT) <= 0) return Status::Corruption(what + " missing");
    Id dapl = h5::ChunkCacheAccess(chunk_ * sizeof(float));
    dsets_[k] = Id(H5Dopen2(file_.get(), kShardKinds[k], dapl.get()), H5Dclose);
    if (!dsets_[k].valid()) return Status::Corruption(what + ": cannot open (" + h5::LastError() + ")");
    Id type(H5Dget_type(dsets_[k].get()), H5Tclose);
    const int64_t len = h5::FloatDatasetLength(dsets_[k].get());
    if (!type.valid() || H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0 || len < 0 ||
        static_cast<uint64_t>(len) != f.elements)
      return Status::Corruption(what + " has " + std::to_string(len) + " float elements, index says " +
                                std::to_string(f.elements) + " little-endian fp32");
    if (f.elements == 0) continue;
    // What HDF5 will follow when reading: one chunk shape, the Fletcher32 filter and no other
    // (no checksum-free chunks, no decompression of a size the file does not hold).
    Id dcpl(H5Dget_create_plist(dsets_[k].get()), H5Pclose);
    hsize_t cdim = 0;
    unsigned flags = 0;
    size_t nelmts = 0;
    const bool chunked = dcpl.valid() && H5Pget_layout(dcpl.get()) == H5D_CHUNKED &&
                         H5Pget_chunk(dcpl.get(), 1, &cdim) == 1 && cdim == chunk_;
    if (!chunked || H5Pget_nfilters(dcpl.get()) != 1 ||
        H5Pget_filter2(dcpl.get(), 0, &flags, &nelmts, nullptr, 0, nullptr, nullptr) != H5Z_FILTER_FLETCHER32)
      return Status::Corruption(what + ": expected chunks of " + std::to_string(chunk_) +
                                " elements with the Fletcher32 filter only");
    checked_[k].assign((f.elements + chunk_ - 1) / chunk_, false);
  }
  return Status::OK();
}

Status ShardFileReader::CheckChunks(int kind, uint64_t offset, uint64_t count) {
  // Every chunk a read touches, once: present, Fletcher32 applied (a set bit in the chunk's
  // filter mask would make HDF5 skip the check), stored at its exact size inside the file.
  for (uint64_t c = offset / chunk_; c * chunk_ < offset + count; c++) {
    if (checked_[kind][c]) continue;
    const hsize_t coord = c * chunk_;
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(dsets_[kind].get(), &coord, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF ||
        mask != 0 || size != (chunk_ + 1) * sizeof(float) || addr > file_bytes_ || size > file_bytes_ - addr)
      return Status::Corruption(path_ + ": dataset /" + kShardKinds[kind] + " chunk at element " +
                                std::to_string(coord) + ": missing, unchecksummed or outside the file");
    checked_[kind][c] = true;
  }
  return Status::OK();
}

Status ShardFileReader::Read(int kind, uint64_t offset, uint64_t count, float* dst) {
  if (kind < 0 || kind > 2 || offset > elements_ || count > elements_ - offset)
    return Status::Internal(path_ + ": read of [" + std::to_string(offset) + ", +" + std::to_string(count) +
                            ") outside the " + std::to_string(elements_) + " elements of the datasets");
  if (count == 0) return Status::OK();
  SHARDGPT_RETURN_IF_ERROR(CheckChunks(kind, offset, count));
  if (h5::ReadSlab(dsets_[kind].get(), offset, count, dst)) return Status::OK();
  const std::string err = h5::LastError();
  const std::string where = path_ + ": dataset /" + kShardKinds[kind] + " elements [" + std::to_string(offset) + ", " +
                            std::to_string(offset + count) + ")";
  if (err.find("Fletcher32") != std::string::npos || err.find("checksum") != std::string::npos)
    return Status::Corruption(where + ": checksum mismatch (" + err + ")");
  return Status::Corruption(where + ": read failed (" + err + ")");
}

Status VerifyShardFile(const std::string& path, const CheckpointIndex& idx, int file_no, uint64_t* bytes_read) {
  ShardFileReader reader;
  SHARDGPT_RETURN_IF_ERROR(reader.Open(path, idx, file_no));
  const CheckpointFile& f = idx.files[file_no];
  const uint32_t want[3] = {f.crc_master, f.crc_m, f.crc_v};
  std::vector<float> buf;
  for (int k = 0; k < 3; k++) {
    uint32_t crc = 0;
    for (uint64_t off = 0; off < f.elements; off += kShardChunkElems) {
      const uint64_t n = std::min<uint64_t>(kShardChunkElems, f.elements - off);
      buf.resize(n);
      SHARDGPT_RETURN_IF_ERROR(reader.Read(k, off, n, buf.data()));
      crc = Crc32c(crc, buf.data(), n * sizeof(float));
      if (bytes_read != nullptr) *bytes_read += n * sizeof(float);
    }
    if (crc != want[k]) {
      char msg[128];
      std::snprintf(msg, sizeof(msg), ": checksum mismatch in dataset /%s (CRC-32C %08" PRIx32 ", index says %08" PRIx32 ")",
                    kShardKinds[k], crc, want[k]);
      return Status::Corruption(path + msg);
    }
  }
  return Status::OK();
}

}  // namespace shardgpt
