#include "ckpt/checkpoint_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/clock.h"
#include "ckpt/checkpoint_h5.h"
#include "ckpt/checkpoint_plan.h"

namespace shardgpt {

using h5::Id;

const char* const kShardKinds[3] = {"master", "m", "v"};

namespace {

constexpr const char* kShardFormat = "shardgpt-checkpoint-shard";
constexpr const char* kShardMagic = "shardgpt checkpoint shard\n";


// The header in the user block: lines of text, zero-padded to kShardHeaderBytes.
std::string ShardHeader(uint64_t checkpoint_id, int64_t rank, int64_t world, int64_t step) {
  char text[kShardHeaderBytes];
  std::snprintf(text, sizeof(text), "%sformat %d\ncheckpoint_id %016" PRIx64 "\nrank %" PRId64 " of %" PRId64
                "\nstep %" PRId64 "\n", kShardMagic, kShardFormatVersion, checkpoint_id, rank, world, step);
  std::string header(kShardHeaderBytes, '\0');
  std::memcpy(&header[0], text, std::strlen(text));
  return header;
}

// Writes the header over the user block, then fsyncs the file.
Status WriteHeader(const std::string& p, const std::string& header) {
  const int fd = open(p.c_str(), O_WRONLY);
  if (fd < 0) return Status::IOError(p + ": cannot open to write its header: " + std::strerror(errno));
  const bool ok = pwrite(fd, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()) && fsync(fd) == 0;
  const std::string err = ok ? "" : std::strerror(errno);
  close(fd);
  if (!ok) return Status::IOError(p + ": cannot write its header or fsync: " + err);
  return Status::OK();
}

// The header's text for a message: printable characters only, lines joined.
std::string Printable(const std::string& header) {
  std::string s;
  for (char c : header.substr(0, 120)) {
    if (c == '\0') break;
    s += c == '\n' ? ' ' : (c >= 32 && c < 127 ? c : '?');
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

Status WriteShardFile(const std::string& path, int rank, int world, uint64_t checkpoint_id, int64_t step,
                      uint64_t n, const ShardFill& fill, ShardWriteResult* out) {
  h5::InitH5();
  const double t0 = MonotonicSeconds();
  Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  if (!fcpl.valid() || H5Pset_userblock(fcpl.get(), kShardHeaderBytes) < 0)
    return Status::Internal(path + ": cannot set up the shard header: " + h5::LastError());
  const hsize_t dims = n, chunk = ShardChunkElems(n);
  // The file's size: the header, three datasets of whole chunks (each with its Fletcher32),
  // HDF5's metadata (superblock, attributes, a chunk index entry per chunk).
  const uint64_t needed = kShardHeaderBytes + 3 * ShardChunks(n) * ((chunk + 1) * sizeof(float) + 64) + 16384;
  Id file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, fcpl.get(), H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return h5::WriteError(path, "cannot create", needed);
  // Any failure from here removes the partial file (unlinked while HDF5 may still hold it open:
  // its space is freed when the Id closes it, just after).
  struct RemoveUnlessKept {
    const std::string& path;
    bool keep = false;
    ~RemoveUnlessKept() {
      if (!keep) std::remove(path.c_str());
    }
  } partial{path};
  SHARDGPT_RETURN_IF_ERROR(h5::ReserveSpace(path, needed));
  bool ok = h5::WriteAttrStr(file.get(), "format", kShardFormat) &&
            h5::WriteAttrU64(file.get(), "checkpoint_id", checkpoint_id) &&
            h5::WriteAttrI64(file.get(), "rank", rank) && h5::WriteAttrI64(file.get(), "world_size", world) &&
            h5::WriteAttrI64(file.get(), "step", step);
  if (!ok) return h5::WriteError(path, "cannot write attributes", needed);
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
      return h5::WriteError(path, std::string("cannot create dataset /") + kShardKinds[k], needed);
    uint32_t crc = 0;
    for (uint64_t lo = 0; lo < n; lo += chunk) {
      const uint64_t hi = std::min<uint64_t>(lo + chunk, n);
      SHARDGPT_RETURN_IF_ERROR(fill(k, lo, hi - lo, staging.data()));
      std::fill(staging.begin() + (hi - lo), staging.begin() + chunk, 0.0f);  // the last chunk's tail
      // One CRC pass per chunk: the chunk's (zero tail included) for the index's chunk table,
      // the dataset's (real elements only) derived from it, except for a partial last chunk.
      const uint32_t chunk_crc = Crc32c(0, staging.data(), chunk * sizeof(float));
      crc = hi - lo == chunk ? Crc32cCombine(crc, chunk_crc, chunk * sizeof(float))
                             : Crc32c(crc, staging.data(), (hi - lo) * sizeof(float));
      const uint32_t fl = Fletcher32(staging.data(), chunk * sizeof(float));
      uint8_t* tail = reinterpret_cast<uint8_t*>(&staging[chunk]);
      for (int b = 0; b < 4; b++) tail[b] = static_cast<uint8_t>(fl >> (8 * b));  // little-endian, as HDF5
      const hsize_t offset = lo;
      if (H5Dwrite_chunk(dset.get(), H5P_DEFAULT, 0, &offset, (chunk + 1) * sizeof(float), staging.data()) < 0)
        return h5::WriteError(path, std::string("cannot write /") + kShardKinds[k], needed);
      // Where HDF5 put it (relative to the end of the user block): the index records it.
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(dset.get(), &offset, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF ||
          size != (chunk + 1) * sizeof(float))
        return Status::IOError(path + ": cannot locate chunk " + std::to_string(lo / chunk) + " of /" +
                               kShardKinds[k] + ": " + h5::LastError());
      out->chunk_offsets[k].push_back(kShardHeaderBytes + addr);
      out->chunk_crcs[k].push_back(chunk_crc);
    }
    if (!dset.Close()) return h5::WriteError(path, std::string("cannot write /") + kShardKinds[k], needed);
    out->crc[k] = crc;
  }
  if (!file.Close()) return h5::WriteError(path, "cannot close", needed);
  h5::ReleaseReserve(path);
  SHARDGPT_RETURN_IF_ERROR(WriteHeader(path, ShardHeader(checkpoint_id, rank, world, step)));
  partial.keep = true;
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) return Status::IOError(path + ": stat failed: " + std::strerror(errno));
  out->elements = n;
  out->bytes = static_cast<uint64_t>(sb.st_size);
  out->seconds = MonotonicSeconds() - t0;
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

ShardFileReader::~ShardFileReader() {
  if (fd_ >= 0) close(fd_);
}

Status ShardFileReader::Open(const std::string& path, const CheckpointIndex& idx, int file_no) {
  path_ = path;
  if (file_no < 0 || static_cast<size_t>(file_no) >= idx.files.size())
    return Status::Internal(path + ": file " + std::to_string(file_no) + " is not in the index");
  const CheckpointFile& f = idx.files[file_no];
  elements_ = f.elements;
  chunk_ = std::max<uint64_t>(1, ShardChunkElems(f.elements));
  for (int k = 0; k < 3; k++) {
    offsets_[k] = f.chunk_offsets[k];
    crcs_[k] = f.chunk_crcs[k];
    if (offsets_[k].size() != ShardChunks(elements_) || crcs_[k].size() != offsets_[k].size())
      return Status::Internal(path + ": the index's chunk table was not validated");
  }
  SHARDGPT_RETURN_IF_ERROR(CheckShardFileSize(path, f.bytes));
  if (fd_ >= 0) close(fd_);
  fd_ = open(path.c_str(), O_RDONLY);
  if (fd_ < 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  std::string header(kShardHeaderBytes, '\0');
  if (pread(fd_, &header[0], header.size(), 0) != static_cast<ssize_t>(header.size()))
    return Status::IOError(path + ": cannot read its header: " + std::strerror(errno));
  const std::string want = ShardHeader(idx.checkpoint_id, file_no, idx.world_size, idx.state.step);
  if (header != want) {
    if (header.compare(0, std::strlen(kShardMagic), kShardMagic) != 0)
      return Status::Corruption(path + ": not a shardgpt shard file (no '" +
                                std::string(kShardMagic, std::strlen(kShardMagic) - 1) + "' header)");
    return Status::Corruption(path + ": belongs to another checkpoint (header: " + Printable(header) +
                              "; index expects: " + Printable(want) + ")");
  }
  return Status::OK();
}

namespace {
std::atomic<uint64_t> g_bytes_read{0};
}  // namespace

uint64_t ShardBytesReadForTesting() { return g_bytes_read.load(); }

Status ShardFileReader::LoadChunk(int kind, uint64_t c) {
  if (buf_kind_ == kind && buf_chunk_ == c) return Status::OK();
  buf_kind_ = -1;
  const uint64_t chunk_bytes = (chunk_ + 1) * sizeof(float);
  chunk_buf_.resize(chunk_ + 1);
  const uint64_t at = offsets_[kind][c];
  const std::string where = path_ + ": dataset /" + kShardKinds[kind] + " chunk " + std::to_string(c) + " (bytes [" +
                            std::to_string(at) + ", " + std::to_string(at + chunk_bytes) + "))";
  char* p = reinterpret_cast<char*>(chunk_buf_.data());
  for (uint64_t got = 0; got < chunk_bytes;) {
    const ssize_t r = pread(fd_, p + got, chunk_bytes - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::Corruption(where + ": read failed (" + (r < 0 ? std::strerror(errno) : "end of file") + ")");
    got += static_cast<uint64_t>(r);
  }
  g_bytes_read += chunk_bytes;
  // The chunk's data, with the CRC-32C the index recorded for it, then HDF5's Fletcher32 of it
  // (little-endian), as the writer appended.
  const uint32_t crc = Crc32c(0, chunk_buf_.data(), chunk_ * sizeof(float));
  if (crc != crcs_[kind][c]) {
    char msg[96];
    std::snprintf(msg, sizeof(msg), ": checksum mismatch (CRC-32C %08" PRIx32 ", index says %08" PRIx32 ")", crc,
                  crcs_[kind][c]);
    return Status::Corruption(where + msg);
  }
  const uint8_t* tail = reinterpret_cast<const uint8_t*>(&chunk_buf_[chunk_]);
  const uint32_t stored = static_cast<uint32_t>(tail[0]) | (static_cast<uint32_t>(tail[1]) << 8) |
                          (static_cast<uint32_t>(tail[2]) << 16) | (static_cast<uint32_t>(tail[3]) << 24);
  const uint32_t computed = Fletcher32(chunk_buf_.data(), chunk_ * sizeof(float));
  if (stored != computed) {
    char msg[96];
    std::snprintf(msg, sizeof(msg), ": checksum mismatch (Fletcher32 %08" PRIx32 ", stored %08" PRIx32 ")", computed,
                  stored);
    return Status::Corruption(where + msg);
  }
  buf_kind_ = kind;
  buf_chunk_ = c;
  return Status::OK();
}

Status ShardFileReader::Read(int kind, uint64_t offset, uint64_t count, float* dst) {
  if (kind < 0 || kind > 2 || fd_ < 0 || offset > elements_ || count > elements_ - offset)
    return Status::Internal(path_ + ": read of [" + std::to_string(offset) + ", +" + std::to_string(count) +
                            ") outside the " + std::to_string(elements_) + " elements of the datasets");
  for (uint64_t at = offset, stop = offset + count; at < stop;) {
    const uint64_t c = at / chunk_, in = at - c * chunk_;
    const uint64_t n = std::min<uint64_t>(stop - at, chunk_ - in);
    SHARDGPT_RETURN_IF_ERROR(LoadChunk(kind, c));
    std::memcpy(dst, chunk_buf_.data() + in, n * sizeof(float));
    dst += n;
    at += n;
  }
  return Status::OK();
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
