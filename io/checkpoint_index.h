// index.h5, the table of contents of a sharded checkpoint (format: docs/CHECKPOINT.md): what
// it holds, how it is written, and how it is read back from a file that may have been copied
// between clusters, damaged or crafted.
//
// The index is an HDF5 file whose 512-byte user block (bytes HDF5 leaves to applications)
// carries a text header with the format version and a CRC-32C of every byte after it. A
// reader loads the whole file (bounded by kMaxIndexBytes), checks that checksum first, then
// opens the very bytes it checked as an in-memory HDF5 image, reads each field with its exact
// type, and validates every field against the others (ValidateCheckpointIndex) before anyone
// uses it. So a flipped byte anywhere is refused before HDF5 parses it, and a file that is
// consistent HDF5 but inconsistent data is refused naming the field.
//
// Thread/rank contract: local functions (no communication), callable without MPI. HDF5 is
// thread-safe here (Debian's build), and every function silences HDF5's own error printing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/checkpoint_plan.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace shardgpt {

// 2: the user-block checksum. Version 1 indexes (no checksum) are refused with a message.
constexpr int kCheckpointFormatVersion = 2;
constexpr size_t kIndexHeaderBytes = 512;            // the HDF5 user block
constexpr uint64_t kMaxIndexBytes = uint64_t{256} << 20;  // ~100x the index of 4096 ranks x d48

struct TrainState {            // everything besides model/optimizer state needed to continue bitwise
  int64_t step = 0;            // optimizer steps done (also the LR schedule position and AdamW t)
  int64_t tokens = 0;          // tokens seen
  uint64_t loader_position = 0; // DataLoader global position (io/data_loader.h LoaderState)
  uint64_t seed = 0;           // data/init seed of the run
};

// One shard file as the index records it.
struct CheckpointFile {
  std::string name;        // "rank_00003.h5", relative to the checkpoint directory
  uint64_t elements = 0;   // length of each of its datasets master, m, v
  uint64_t bytes = 0;      // file size after the save
  uint32_t crc_master = 0, crc_m = 0, crc_v = 0;  // CRC-32C of each dataset's fp32 bytes
};

// Everything index.h5 holds.
struct CheckpointIndex {
  std::string dir;  // the checkpoint directory it was read from
  int format_version = 0;
  uint64_t checkpoint_id = 0;  // random per save; every shard file carries it
  GPTConfig config;
  std::vector<TensorInfo> tensors;  // name, shape, unit, offset, numel (dtype is always f32)
  std::vector<UnitInfo> units;      // name, global offset, numel
  int world_size = 0;               // saving run's rank count
  int zero_stage = 0;
  std::string dtype;                // saving run's parameter dtype ("f32", "bf16"); state is fp32
  TrainState state;
  std::vector<SavedPiece> pieces;  // the saving run's plan
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
// dtype; training state (0 <= step < 2^31, tokens >= 0); the config (CheckFileConfig, at most
// kMaxFileParams parameters); the tensor and unit tables equal to the layout the config
// implies; the plan covering every unit exactly once and each file contiguously from 0
// (CheckPieces); each file named rank_NNNNN.h5 in order, its element count the plan's and its
// size at least the 12 bytes per element its three datasets need.
Status ValidateCheckpointIndex(const CheckpointIndex& idx, const std::string& where);

// Rewrites the user block of an index image so that its checksum matches the rest: how the
// writer seals a file, and how fuzzing and tests make edited bytes reach the HDF5 parser.
// No-op on images shorter than the header.
void SealCheckpointIndexImage(std::string* bytes);

}  // namespace shardgpt
