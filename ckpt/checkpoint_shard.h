// One shard file of a sharded checkpoint, rank_NNNNN.h5 (format: docs/CHECKPOINT.md): a
// 512-byte text header (the HDF5 user block: checkpoint id, rank, world size, step), then an
// HDF5 file with three 1-D fp32 datasets master, m, v of equal length, chunked by
// ShardChunkElems elements with HDF5's Fletcher32 filter, so h5py and h5dump read it.
//
// shardgpt reads a shard without parsing its HDF5 metadata (libhdf5 1.10 is not safe on
// crafted files): the writer records every chunk's file offset in the index, and the reader
// checks the header against the index, then reads each chunk it needs at its recorded offset
// and checks the chunk's CRC-32C recorded in the index and its Fletcher32 trailer (as HDF5
// computes it; Fletcher32 alone misses some changes, e.g. a 16-bit word 0000 <-> ffff)
// before using a byte of it. A read touches only byte ranges the validated index placed
// inside the file, and allocates one chunk at most.
//
// Thread/rank contract: local (no communication). One ShardFileReader per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/checkpoint_index.h"

namespace shardgpt {

extern const char* const kShardKinds[3];  // "master", "m", "v"

// Copies elements [at, at + count) of dataset `kind` (0 master, 1 m, 2 v) into dst.
using ShardFill = std::function<Status(int kind, uint64_t at, uint64_t count, float* dst)>;

struct ShardWriteResult {
  uint64_t elements = 0, bytes = 0;
  uint32_t crc[3] = {0, 0, 0};             // CRC-32C of each dataset's fp32 bytes
  std::vector<uint64_t> chunk_offsets[3];  // file offset of each chunk, per dataset
  std::vector<uint32_t> chunk_crcs[3];     // CRC-32C of each chunk's data bytes
  double seconds = 0;
};

// Writes `path` (which must not exist) with `elements` elements per dataset, filled chunk by
// chunk through `fill` (one chunk-sized staging buffer, no copy of the whole slice), writes
// the header, closes and fsyncs it.
Status WriteShardFile(const std::string& path, int rank, int world, uint64_t checkpoint_id, int64_t step,
                      uint64_t elements, const ShardFill& fill, ShardWriteResult* out);

// Missing (NotFound), truncated or resized shard files, named.
Status CheckShardFileSize(const std::string& path, uint64_t expected);

// An open shard file, checked against file `file_no` of a validated index.
class ShardFileReader {
 public:
  ShardFileReader() = default;
  ShardFileReader(const ShardFileReader&) = delete;
  ShardFileReader& operator=(const ShardFileReader&) = delete;
  ~ShardFileReader();

  // Size as recorded, and the header: this checkpoint's id, rank, world size and step.
  Status Open(const std::string& path, const CheckpointIndex& idx, int file_no);
  // `count` floats at element `offset` of dataset `kind`, each chunk's checksums checked.
  Status Read(int kind, uint64_t offset, uint64_t count, float* dst);

 private:
  Status LoadChunk(int kind, uint64_t c);

  std::string path_;
  int fd_ = -1;
  uint64_t elements_ = 0, chunk_ = 1;
  std::vector<uint64_t> offsets_[3];
  std::vector<uint32_t> crcs_[3];
  std::vector<float> chunk_buf_;  // one chunk and its checksum
  int buf_kind_ = -1;
  uint64_t buf_chunk_ = 0;
};

// Bytes this process has read from shard files (whole chunks with their checksums, by
// ShardFileReader), for tests that check a load reads only the chunks it needs.
uint64_t ShardBytesReadForTesting();

// Reads every element of file `file_no` (Fletcher32 per chunk) and checks each dataset's
// CRC-32C against the index; adds the bytes read to *bytes_read.
Status VerifyShardFile(const std::string& path, const CheckpointIndex& idx, int file_no, uint64_t* bytes_read);

}  // namespace shardgpt
