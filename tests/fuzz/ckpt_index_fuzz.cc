// Fuzz target: a checkpoint's index.h5 (ckpt/checkpoint_index.h): its checksum, then its JSON
// content and our validation of it against the model and the plan. (The index's HDF5 part is
// never parsed by shardgpt; its header explains why.)
// Each input is parsed twice: as it is (almost every mutation must fail the checksum), and
// re-sealed (SealCheckpointIndexImage) so the mutation reaches the JSON parser and the
// validation, as a crafted file would.
// Contract: an error naming index.h5, or an index that (1) validates again, (2) describes a
// layout whose every parameter the plan stores exactly once, (3) gives every loading rank of
// 1, 2, 3 or 7 ranks (and stage 0's whole units) reads that stay inside the recorded files
// and fill its range exactly once, and (4) survives a write and read back unchanged.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include <hdf5.h>

#include "fuzz_util.h"
#include "ckpt/checkpoint_index.h"
#include "parallel/shard_plan.h"

using namespace shardgpt;

namespace {

void CheckReads(const CheckpointIndex& idx, int unit, uint64_t begin, uint64_t end) {
  std::vector<std::pair<uint64_t, uint64_t>> dest;
  for (const ReadOp& op : PlanReads(idx.pieces, unit, begin, end)) {
    FUZZ_CHECK(op.file >= 0 && op.file < idx.world_size, "read from file %d", op.file);
    const uint64_t elems = idx.files[op.file].elements;
    FUZZ_CHECK(op.count > 0 && op.file_offset <= elems && op.count <= elems - op.file_offset, "read past file %d",
               op.file);
    FUZZ_CHECK(op.dest_offset <= end - begin && op.count <= end - begin - op.dest_offset, "read past the range");
    dest.emplace_back(op.dest_offset, op.dest_offset + op.count);
  }
  std::sort(dest.begin(), dest.end());
  uint64_t at = 0;
  for (const auto& d : dest) {
    FUZZ_CHECK(d.first == at, "unit %d: destination [%llu, ...) not filled exactly once", unit,
               static_cast<unsigned long long>(at));
    at = d.second;
  }
  FUZZ_CHECK(at == end - begin, "unit %d: range not filled", unit);
}

void CheckValidIndex(const CheckpointIndex& idx, const std::string& path) {
  FUZZ_CHECK(ValidateCheckpointIndex(idx, path).ok(), "a parsed index does not validate");
  const ParamLayout layout(idx.config);
  uint64_t stored = 0, bytes = 0;
  for (const CheckpointFile& f : idx.files) stored += f.elements, bytes += f.bytes;
  FUZZ_CHECK(stored == layout.total_numel() && bytes / 12 >= stored, "files hold %llu of %zu parameters",
             static_cast<unsigned long long>(stored), layout.total_numel());
  for (int u = 0; u < layout.num_units(); u++) CheckReads(idx, u, 0, layout.units()[u].numel);
  for (ShardLayout sl : {ShardLayout::kFlat, ShardLayout::kPerParam})
    for (int world : {1, 2, 3, 7}) {
      const ShardPlan plan(layout, world, sl);
      for (int r = 0; r < world; r++)
        for (int u = 0; u < layout.num_units(); u++)
          for (const OwnedPiece& p : plan.OwnedPieces(u, r)) CheckReads(idx, u, p.begin, p.end);
    }
  // Written and read back: the same index.
  const std::string dir = fuzz::ScratchDir() + "/roundtrip";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  FUZZ_CHECK(WriteCheckpointIndex(dir + "/index.h5", idx).ok(), "cannot write a valid index");
  auto back = ReadCheckpointIndex(dir);
  FUZZ_CHECK(back.ok(), "a written index does not read back: %s", back.status().message().c_str());
  const CheckpointIndex& b = *back;
  FUZZ_CHECK(b.checkpoint_id == idx.checkpoint_id && b.world_size == idx.world_size &&
                 b.zero_stage == idx.zero_stage && b.dtype == idx.dtype && b.state.step == idx.state.step &&
                 b.state.tokens == idx.state.tokens && b.state.loader_position == idx.state.loader_position &&
                 b.state.seed == idx.state.seed && b.config.FirstDifference(idx.config).empty() &&
                 b.pieces.size() == idx.pieces.size() && b.files.size() == idx.files.size(),
             "round trip differs");
  for (size_t i = 0; i < b.files.size(); i++)
    FUZZ_CHECK(b.files[i].bytes == idx.files[i].bytes && b.files[i].crc_master == idx.files[i].crc_master &&
                   b.files[i].crc_m == idx.files[i].crc_m && b.files[i].crc_v == idx.files[i].crc_v,
               "file %zu differs after a round trip", i);
}

void ParseBoth(const uint8_t* data, size_t size) {
  const std::string path = "ckpt/index.h5";
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto as_is = ParseCheckpointIndex(bytes, path, "ckpt");
  std::string sealed = bytes;
  SealCheckpointIndexImage(&sealed);
  if (as_is.ok()) {
    FUZZ_CHECK(sealed == bytes, "accepted an index whose checksum does not match");
    CheckValidIndex(*as_is, path);
    return;
  }
  fuzz::CheckError(as_is.status(), path);
  auto idx = ParseCheckpointIndex(sealed, path, "ckpt");
  if (!idx.ok()) {
    fuzz::CheckError(idx.status(), path);
    return;
  }
  CheckValidIndex(*idx, path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ParseBoth(data, size);
  FUZZ_CHECK_NO_OPEN_HDF5();
  return 0;
}
