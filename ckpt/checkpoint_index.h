// index.h5, the table of contents of a sharded checkpoint (format: docs/CHECKPOINT.md): what
// it holds, how it is written, and how it is read back from a file that may have been copied
// between clusters, damaged or crafted.
//
// The index is an HDF5 file (so h5py and h5dump show its tables) whose user block, the bytes
// HDF5 leaves to applications at the start of a file, carries a 128-byte text header (format
// version, CRC-32C of every byte after the header, sizes) followed by the same content as
// JSON. shardgpt reads ONLY the header and the JSON, never the HDF5 part: libhdf5 1.10 has
// memory-safety bugs on crafted files (fuzzing found a heap-use-after-free in its attribute
// lookup within a minute), so no byte of a file from outside reaches its parser. A reader
// loads the whole file (at most kMaxIndexBytes), checks the checksum first (a flipped byte
// anywhere in the file is refused), parses the JSON with exact types, and validates every
// field against the others (ValidateCheckpointIndex) before anyone uses it.
//
// Thread/rank contract: local functions (no communication), callable without MPI; reading
// is thread-safe, writing uses HDF5 (serialised by its thread-safe build).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/checkpoint_plan.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace shardgpt {

// 3: the plan as per-parameter chunks (global shape + box per file, as PyTorch DCP), and the
//    saving run's shard layout.
// 2: checksummed header + JSON in the user block; shard files with a header and a chunk
//    table; the plan as pieces of units. Still read (its pieces become chunks).
// Version 1 indexes (plain HDF5, no checksum) are refused with a message.
constexpr int kCheckpointFormatVersion = 3;
constexpr int kOldestReadFormatVersion = 2;
// Shard files did not change in format 3: their header still says "format 2", so the shard
// files of format 2 and 3 checkpoints are read alike.
constexpr int kShardFormatVersion = 2;
constexpr size_t kIndexHeaderBytes = 128;                  // the text header; the JSON follows
constexpr uint64_t kMaxIndexBytes = uint64_t{256} << 20;  // ~100x the index of 4096 ranks x d48
// Shard files (ckpt/checkpoint_shard.h): a 512-byte text header (HDF5 user block), then HDF5
// with datasets chunked by kShardChunkElems elements, each chunk followed by its Fletcher32.
constexpr uint64_t kShardHeaderBytes = 512;
constexpr uint64_t kShardChunkElems = uint64_t{1} << 20;  // 4 MiB chunks: Fletcher32 granularity

struct TrainState {            // everything besides model/optimizer state needed to continue bitwise
  int64_t step = 0;            // optimizer steps done (also the LR schedule position and AdamW t)
  int64_t tokens = 0;          // tokens seen
  uint64_t loader_position = 0; // DataLoader global position (io/data_loader.h LoaderState)
  uint64_t seed = 0;           // data/init seed of the run
  // What the saving run's data order depended on, checked when a run resumes (app/train.cc).
  // Absent from indexes written before these fields existed: 0 / -1 / empty = not recorded.
  int64_t batch_samples = 0;   // sequences per optimizer step over all ranks (B x ranks x grad-accum)
  int64_t seq_len = 0;         // T
  int shuffle = -1;            // 1 shuffled, 0 file order
  struct DataFile {
    std::string path;          // as the --data glob expanded it
    uint64_t tokens = 0;
  };
  std::vector<DataFile> data_files;  // in the loader's order
};

// One shard file as the index records it.
struct CheckpointFile {
  std::string name;        // "rank_00003.h5", relative to the checkpoint directory
  uint64_t elements = 0;   // length of each of its datasets master, m, v
  uint64_t bytes = 0;      // file size after the save
  uint32_t crc_master = 0, crc_m = 0, crc_v = 0;  // CRC-32C of each dataset's fp32 bytes
  // Every chunk of datasets master, m, v (ShardChunks(elements) each): its file offset, and
  // the CRC-32C of its data bytes (the last chunk's zero tail included, its Fletcher32
  // trailer excluded). What readers read and check, without parsing the file's HDF5 metadata.
  std::vector<uint64_t> chunk_offsets[3];
  std::vector<uint32_t> chunk_crcs[3];
};

// Elements per chunk of a shard file whose datasets hold `elements` (0 for an empty file),
// and the number of chunks per dataset.
inline uint64_t ShardChunkElems(uint64_t elements) { return elements < kShardChunkElems ? elements : kShardChunkElems; }
inline uint64_t ShardChunks(uint64_t elements) {
  return elements == 0 ? 0 : (elements + kShardChunkElems - 1) / kShardChunkElems;
}

// Everything index.h5 holds.
struct CheckpointIndex {
  std::string dir;  // the checkpoint directory it was read from
  int format_version = 0;
  uint64_t checkpoint_id = 0;  // random per save; every shard file carries it
  GPTConfig config;
  std::vector<TensorInfo> tensors;  // name, shape, unit, offset, numel (dtype is always f32)
  std::vector<UnitInfo> units;      // name, global offset, numel
  int world_size = 0;               // shard files = ranks of one shard group (G; N without HSDP)
  int ranks = 0;                    // saving run's rank count N (optional in the file: world_size)
  int shard_group_size = 0;         // saving run's G (HSDP), = world_size (optional in the file)
  int zero_stage = 0;
  std::string dtype;                // saving run's parameter dtype ("f32", "bf16"); state is fp32
  std::string optimizer = "adamw";  // "adamw" or "muon" (m then holds Muon's momentum at its
                                    // matrices, v zeros there); absent in older indexes: adamw
  std::string shard_layout = "flat";  // saving run's --shard-layout ("flat", "per-param"; format 2: flat)
  TrainState state;
  // The saving run's plan: what each file holds, per parameter (what the index stores;
  // writers fill it, e.g. ChunksFromPieces of PlanSave), and the same in unit coordinates
  // (filled by the reader from the chunks; what loading intersects with its own pieces).
  std::vector<SavedChunk> chunks;
  std::vector<SavedPiece> pieces;
  std::vector<CheckpointFile> files;
  uint64_t total_bytes() const;
};

// "rank_00003.h5": the name of saving rank r's shard file.
std::string ShardFileName(int rank);

// Writes idx to `path` (which must not exist): HDF5 with the checksummed user block, fsynced.
Status WriteCheckpointIndex(const std::string& path, const CheckpointIndex& idx);

// Reads and validates checkpoint_dir/index.h5 (checksum, structure, every field).
StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& checkpoint_dir);

// The same from the file's bytes; `path` names the file in messages, `dir` goes to idx.dir.
StatusOr<CheckpointIndex> ParseCheckpointIndex(const std::string& bytes, const std::string& path,
                                               const std::string& dir);

// Checks an index's fields against each other, each message starting with `where` and naming
// the field: format version; saving world (1 to 2^24 ranks, one file each) and stage (0-3);
// dtype; shard layout; training state (0 <= step < 2^31, tokens >= 0); the config
// (CheckFileConfig, at most kMaxFileParams parameters); the tensor and unit tables equal to
// the layout the config implies; every chunk a contiguous box inside its tensor's shape
// (PieceOfChunk; format 2: the pieces), together covering every element exactly once and
// each file contiguously from 0 (CheckPieces); each file named rank_NNNNN.h5 in order, its element count the plan's, and its
// chunk table complete, each chunk (with its checksum) inside the file after the header, no
// two overlapping.
Status ValidateCheckpointIndex(const CheckpointIndex& idx, const std::string& where);

// Rewrites the header of an index image so that its checksum and size match the rest (the
// JSON length it states is kept): how the writer seals a file, and how fuzzing and tests make
// edited bytes reach the JSON parser and the validation. No-op on images shorter than the header.
void SealCheckpointIndexImage(std::string* bytes);

}  // namespace shardgpt
