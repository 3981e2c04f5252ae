// Checkpoint planning: which flat range of which unit lies where in which shard file, and
// which byte ranges a loading rank must read. Pure arithmetic, no MPI, no HDF5 (like PyTorch
// DCP's planner), so every resharding case is unit-testable in one process.
//
// A checkpoint saved by N ranks has N shard files. File r holds, for every unit u in order,
// the real elements of rank r's pieces of ShardPlan(layout, N, shard layout)
// (ShardPlan::OwnedPieces: one range per unit for the flat layout, one per tensor row-slice
// for per-param), concatenated (no padding), once per state kind (master, m, v). With stage 0
// every rank still writes only those pieces, so nothing is written twice. The table of these pieces (SavedPiece) is
// stored in the index; loading intersects it with the range a loading rank needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/param_layout.h"
#include "parallel/shard_plan.h"

namespace shardgpt {

// One contiguous piece of a unit stored in one shard file.
struct SavedPiece {
  int unit = 0;
  int file = 0;            // shard file index = saving rank
  uint64_t begin = 0;      // unit coordinates [begin, end)
  uint64_t end = 0;
  uint64_t file_offset = 0;  // element offset of `begin` in the file's datasets
};

// The same storage described per parameter, as the index records it (PyTorch DCP's
// ChunkStorageMetadata): the box [offsets, offsets + sizes) of tensor `tensor`'s global shape,
// stored row-major and contiguously at element `file_offset` of file `file`. A piece of a unit
// becomes one chunk per tensor it touches, or up to three where it starts or ends inside a
// row of a 2-D tensor (a partial first row, whole rows, a partial last row); the per-param
// layout's pieces are whole rows, so one chunk each.
struct SavedChunk {
  int tensor = 0;
  int file = 0;
  std::vector<uint64_t> offsets, sizes;  // one per dimension of the tensor's shape
  uint64_t file_offset = 0;
};

// Every piece as chunks, in the pieces' order. Pieces must lie inside their units (as
// PlanSave's do).
std::vector<SavedChunk> ChunksFromPieces(const ParamLayout& layout, const std::vector<SavedPiece>& pieces);
// The piece (unit coordinates) chunk c is, or a message naming what is wrong with it: tensor
// or file out of range, offsets / sizes not one per dimension, a size 0, a box outside the
// tensor's shape, or a box that is not contiguous in row-major order (only its first
// non-unit dimension may be partial). `num_files` bounds c.file.
Status PieceOfChunk(const ParamLayout& layout, const SavedChunk& c, int num_files, SavedPiece* piece);

// One read a loading rank performs: `count` elements at `file_offset` of file `file`, to be
// placed at element `dest_offset` of the destination range (relative to its begin).
struct ReadOp {
  int file = 0;
  uint64_t file_offset = 0;
  uint64_t count = 0;
  uint64_t dest_offset = 0;
};

// The pieces written by a run of `world` ranks, in (file, unit) order; empty ranges omitted.
std::vector<SavedPiece> PlanSave(const ParamLayout& layout, int world, ShardLayout shard_layout = ShardLayout::kFlat);
// Elements per file of the plan above (the length of each file's datasets).
std::vector<uint64_t> FileElements(const std::vector<SavedPiece>& pieces, int num_files);

// Checks that pieces cover every unit [0, numel) exactly once, that files are in range and
// that each file's pieces are contiguous from 0 (so FileElements is the dataset length).
// The message names the first problem ("unit 3: elements [0, 10) stored twice").
Status CheckPieces(const std::vector<SavedPiece>& pieces, const std::vector<uint64_t>& unit_numel, int num_files);

// The reads that fill [begin, end) of `unit` from the saved pieces, sorted by (file, offset);
// adjacent reads of one file are merged. Only the intersecting pieces are read.
std::vector<ReadOp> PlanReads(const std::vector<SavedPiece>& pieces, int unit, uint64_t begin, uint64_t end);

// CRC-32C (Castagnoli), chainable: Crc32c(Crc32c(0, a), b) == crc of a followed by b.
// Hardware instruction where available (SSE4.2), else a table.
uint32_t Crc32c(uint32_t crc, const void* data, size_t bytes);
// The CRC-32C of a followed by b from crc_a = Crc32c(0, a), crc_b = Crc32c(0, b) and b's
// length, without the data (zlib's crc32_combine, for the Castagnoli polynomial): lets the
// shard writer derive each dataset's CRC from its chunks' CRCs instead of a second pass.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

// HDF5's Fletcher32 checksum of `bytes` (even) bytes, bit-identical to the value HDF5's
// Fletcher32 filter appends to a chunk (stored little-endian after the data), so chunks can
// be written pre-filtered with H5Dwrite_chunk. Same 360-word blocks and folds as HDF5's
// H5_checksum_fletcher32, with each block's sums computed in a vectorisable loop.
uint32_t Fletcher32(const void* data, size_t bytes);

// "step_00000123"
std::string StepDirName(int64_t step);
// The step of a "step_XXXXXXXX" name, or -1.
int64_t ParseStepDirName(const std::string& name);

}  // namespace shardgpt
