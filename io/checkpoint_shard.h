// One shard file of a sharded checkpoint, rank_NNNNN.h5 (format: docs/CHECKPOINT.md): three
// 1-D fp32 datasets master, m, v of equal length, chunked with HDF5's Fletcher32 filter, and
// the root attributes that tie the file to its checkpoint (checkpoint_id, rank, world_size,
// step). The writer takes its data through a callback (the engine's buffers, or test data);
// the reader checks the file against the index before any data moves, and checks the storage
// HDF5 will follow (chunk shape, filters, each chunk's checksum flag and extent), so a damaged
// or crafted file can neither skip the checksum nor make HDF5 allocate more than a chunk.
//
// Thread/rank contract: local (no communication). One ShardFileReader per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/checkpoint_h5.h"
#include "io/checkpoint_index.h"

namespace shardgpt {

constexpr uint64_t kShardChunkElems = uint64_t{1} << 20;  // 4 MiB chunks: Fletcher32 granularity
extern const char* const kShardKinds[3];                 // "master", "m", "v"

// Copies elements [at, at + count) of dataset `kind` (0 master, 1 m, 2 v) into dst.
using ShardFill = std::function<Status(int kind, uint64_t at, uint64_t count, float* dst)>;

struct ShardWriteResult {
  uint64_t elements = 0, bytes = 0;
  uint32_t crc[3] = {0, 0, 0};  // CRC-32C of each dataset's fp32 bytes
  double seconds = 0;
};

// Writes `path` (which must not exist) with `elements` elements per dataset, filled chunk by
// chunk through `fill` (one chunk-sized staging buffer, no copy of the whole slice), closes
// and fsyncs it.
Status WriteShardFile(const std::string& path, int rank, int world, uint64_t checkpoint_id, int64_t step,
                      uint64_t elements, const ShardFill& fill, ShardWriteResult* out);

// Missing (NotFound), truncated or resized shard files, named.
Status CheckShardFileSize(const std::string& path, uint64_t expected);

// An open shard file with its three datasets, checked against file `file_no` of the index.
class ShardFileReader {
 public:
  // Size as recorded, HDF5 structure, checkpoint id, rank and world, each dataset's type,
  // length, chunking, filters and every chunk's filter mask and extent.
  Status Open(const std::string& path, const CheckpointIndex& idx, int file_no);
  // `count` floats at element `offset` of dataset `kind`; Fletcher32 is checked by HDF5.
  Status Read(int kind, uint64_t offset, uint64_t count, float* dst);

 private:
  Status CheckChunks(int kind, uint64_t offset, uint64_t count);

  std::string path_;
  uint64_t elements_ = 0, file_bytes_ = 0, chunk_ = 1;
  h5::Id file_;
  h5::Id dsets_[3];
  std::vector<bool> checked_[3];  // per chunk: storage checked (CheckChunks)
};

// Reads every element of file `file_no` (Fletcher32 per chunk) and checks each dataset's
// CRC-32C against the index; adds the bytes read to *bytes_read.
Status VerifyShardFile(const std::string& path, const CheckpointIndex& idx, int file_no, uint64_t* bytes_read);

}  // namespace shardgpt
