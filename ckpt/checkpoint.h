// Sharded HDF5 checkpoints (format: docs/CHECKPOINT.md), like PyTorch DCP: every rank writes
// its own slice of the fp32 master parameters and AdamW moments to its own file, rank 0 writes
// the index last; loading reads, on every rank, only the pieces its own sharding plan needs,
// so a run may resume on another rank count and ZeRO stage.
//
// A checkpoint is DIR/step_XXXXXXXX/ holding rank_NNNNN.h5 (one per saving rank) and
// index.h5. It is written into DIR/.tmp.step_XXXXXXXX/, fsynced, then renamed into place, and
// DIR/latest (a small text file naming the step directory) is replaced atomically after that;
// a directory without index.h5 is never loaded. So a crash at any moment of a save leaves the
// previous checkpoint loadable.
//
// Rank contract: SaveCheckpoint and LoadCheckpoint are collective over `comm` (every rank
// calls them with the same arguments); on failure EVERY rank returns an error carrying the
// same one-line message naming the file and the problem (no rank hangs). All ranks must see
// the same file system at DIR (one node, or a shared file system). The other functions are
// local (no communication) and may run in a single process without MPI.
//
// The index file itself (its checksum, fields and validation) is ckpt/checkpoint_index.h; one
// shard file (writer, checked reader) is ckpt/checkpoint_shard.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/checkpoint_index.h"
#include "ckpt/checkpoint_plan.h"
#include "ckpt/checkpoint_shard.h"
#include "io/llmc_model.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/engine.h"

namespace shardgpt {

// Collective. Writes DIR/step_XXXXXXXX/ (8 digits) atomically: tmp dir, one HDF5 file per rank with that
// rank's fp32 master / m / v slices, then the index written LAST by rank 0, fsync, rename, then DIR/latest
// updated atomically (a small file written via rename); keep_last > 0 deletes older complete
// checkpoints only after the new one is complete. Prints per-rank and total GB/s on rank 0 unless quiet.
// Saving the same step twice replaces the old directory atomically (renameat2 RENAME_EXCHANGE).
// Writes straight from the engine's buffers (no extra model copy in memory).
Status SaveCheckpoint(const std::string& dir, const TrainState& state, Engine& engine, const ParamLayout& layout,
                      Communicator& comm, int keep_last, bool quiet);

// What a rank's part of a save is: `files` shard files (the shard group size G; N without
// HSDP), written by the ranks of group 0 only (`writer`: HSDP's replicas hold bitwise-equal
// shards), this rank's being file `file` (its index in its group), and the stage, dtype and
// optimizer the index records.
struct SaveRole {
  int zero_stage = 0;
  DType dtype = DType::kF32;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  ShardLayout shard_layout = ShardLayout::kFlat;
  int files = 1, file = 0;
  bool writer = true;
};
SaveRole SaveRoleOf(const Engine& engine);

// SaveCheckpoint with this rank's shard data taken from `fill` (the elements of its file, dataset
// by dataset: see OwnedShardElements) instead of the engine: what the async writer
// (ckpt/async_checkpoint.h) runs on its own thread and communicator, from a staged copy.
// Collective over comm.
Status SaveCheckpointFrom(const std::string& dir, const TrainState& state, const ParamLayout& layout,
                          const SaveRole& role, const ShardFill& fill, Communicator& comm, int keep_last, bool quiet);
// Elements per dataset (master, m, v) of this rank's shard file (role.file of role.files).
uint64_t OwnedShardElements(const ParamLayout& layout, const SaveRole& role);
// This rank's shard data, copied from the engine (through the device) into host memory `out`
// holding 3 x OwnedShardElements floats: master, then m, then v. Local.
Status CopyOwnedShard(Engine& engine, const ParamLayout& layout, const SaveRole& role, float* out);

// Collective. `path` is a checkpoint directory, or "latest" meaning the one DIR/latest points to (dir = ckpt_dir).
// Refuses (one line naming the file and the problem; all ranks return an error, no hang): missing dir, not a
// checkpoint (no index), an index that fails its checksum or its validation (names the field), missing shard
// file, truncated file, checksum mismatch (flipped byte), other model config (names the first differing field). Works for any saved rank count/stage -> any loading rank count/stage: each
// rank reads only the pieces its Owned(u) ranges need (hyperslab reads). Fills engine state via Owned(u), then
// engine.set_step_count(state.step) and engine.SyncParamsFromMaster(). Prints throughput on rank 0.
// Everything that can be checked before reading data is checked before the engine is touched; a checksum
// error found while reading leaves the engine's state partly overwritten (do not train on after an error).
StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm);
// The same, printing nothing when quiet.
StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm, bool quiet);

// Why a load failed, as far as `--resume auto` cares. The damage kinds are the checkpoint's
// own (its index, a shard file's presence, size, header or chunk checksums): an older
// checkpoint may still be good. kRun is everything else (another model config or optimizer,
// an index format this build does not read, a missing directory): about the run, not the
// files, so it stays an error and nothing is renamed.
enum class LoadProblem { kNone, kIndex, kMissingShard, kTruncatedShard, kShardHeader, kChecksum, kRun };
// "index", "missing-shard", "truncated-shard", "shard-header", "checksum" (the `.bad-<reason>`
// suffix), "run", "none".
const char* LoadProblemName(LoadProblem p);
inline bool IsCheckpointDamage(LoadProblem p) { return p != LoadProblem::kNone && p != LoadProblem::kRun; }

// LoadCheckpoint that also says, identically on every rank, which kind of problem failed it.
// Transactional for a resume that tries several checkpoints: the step count and the working
// parameters (SyncParamsFromMaster) are committed only after every rank has read and checked
// all its data; a failure while reading leaves some owned master/m/v elements overwritten,
// and the next successful LoadCheckpoint overwrites every owned element of the three (the
// index's chunks cover each element exactly once, checked before any data moves), so nothing
// of a failed candidate survives a successful one.
StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm, bool quiet, LoadProblem* problem);

// What `--resume auto` tries, in order (docs/CHECKPOINT.md, "Which checkpoint a resume
// reads"): the directory DIR/latest names, then every other complete step_* directory (one
// with index.h5; `.bad-*` and `.tmp.*` never are), newest first. `latest_problem` is set (one
// line naming DIR/latest) when latest exists but cannot be used: then the list is just the
// complete step_* directories, newest first. Local.
struct ResumeCandidates {
  std::vector<std::string> dirs;
  std::string latest_problem;
};
ResumeCandidates ListResumeCandidates(const std::string& ckpt_dir);

// Renames the damaged checkpoint directory `dir` to `dir.bad-<reason>` (`-2`, `-3`, ... when
// that name is taken) and fsyncs its parent; nothing is deleted. Returns the new path. Local.
StatusOr<std::string> QuarantineCheckpoint(const std::string& dir, const std::string& reason);
// Replaces ckpt_dir/latest atomically with the name `step_dir_name`. Local.
Status PointLatestAt(const std::string& ckpt_dir, const std::string& step_dir_name);

// Reads only the model config stored in a checkpoint's index (so the loop can build the layout before the engine).
StatusOr<GPTConfig> ReadCheckpointConfig(const std::string& path, const std::string& ckpt_dir);

// The checkpoint directory `path` names: "latest" -> the directory ckpt_dir/latest names (or, if
// there is no `latest` entry at all, the newest complete step_* directory); a directory with
// index.h5 -> itself; a directory with a `latest` file (a --ckpt-dir) -> what it names. NotFound
// when there is no checkpoint at all (a fresh run), another error when the path is not a
// checkpoint. A `latest` that exists but cannot be used (empty, not a step_XXXXXXXX name, a
// dangling symlink, a symlink loop, a directory, naming a directory without index.h5) is an
// error naming it: an explicit choice is never replaced by another checkpoint.
StatusOr<std::string> ResolveCheckpoint(const std::string& path, const std::string& ckpt_dir);

// Reads every byte of every shard file and checks sizes, HDF5 structure, Fletcher32 chunk
// checksums and the index's CRC-32C per dataset. Local. On success fills *index and the
// number of data bytes read.
Status VerifyCheckpoint(const std::string& path, CheckpointIndex* index, uint64_t* bytes_read);

// The full fp32 master parameters in layout order, with the model config (for sample/export).
// Local; reads only the master datasets. `path` as for ResolveCheckpoint with ckpt_dir = "".
StatusOr<LlmcModel> LoadCheckpointFullModel(const std::string& path);

// One consolidated HDF5 file: every parameter at its full shape under its name (attributes
// unit and offset, the config on the root group), written via a temp file and rename.
Status WriteFullModelH5(const std::string& path, const ParamLayout& layout, const float* params);

// Test hook: makes the next SaveCheckpoint fail as if the process died after the shard files
// were written and before the index (leaving the temp directory behind). Local setting: call
// it on every rank.
void FailNextSaveBeforeIndexForTesting();

}  // namespace shardgpt
