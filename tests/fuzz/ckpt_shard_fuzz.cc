// Fuzz target: one checkpoint shard file, rank_00000.h5 (ckpt/checkpoint_shard.h), read against
// the index entry the seed was written for (tests/fuzz/fuzz_util.h: id, step, 300 elements,
// known values, and the chunk offsets the writer reports), with the recorded size set to the
// input's so that every mutation reaches the reader.
// Contract: an error naming the file, or data equal to what was written: a sub-range read
// (offset and length varying with the input) and the whole verify (Fletcher32 per chunk,
// CRC-32C per dataset) return the seed's exact values. No read outside the file, no chunk
// used without its checksum, no allocation beyond a chunk, no HDF5 handle left open.
#include <cstring>
#include <filesystem>
#include <vector>

#include <hdf5.h>

#include "fuzz_util.h"
#include "ckpt/checkpoint_shard.h"

using namespace shardgpt;

namespace {

// Where the writer puts the seed's chunks and their CRCs (the index's chunk table for it):
// written once.
const ShardWriteResult& SeedChunks() {
  static const ShardWriteResult* result = [] {
    const std::string path = fuzz::ScratchDir() + "/seed.h5";
    std::filesystem::remove(path);
    static ShardWriteResult res;
    const Status st = WriteShardFile(path, 0, 1, fuzz::kShardSeedId, 7, fuzz::kShardSeedElems,
                                     [](int k, uint64_t at, uint64_t count, float* dst) {
                                       for (uint64_t i = 0; i < count; i++) dst[i] = fuzz::ShardSeedValue(k, at + i);
                                       return Status::OK();
                                     },
                                     &res);
    FUZZ_CHECK(st.ok(), "cannot write the seed shard: %s", st.message().c_str());
    return &res;
  }();
  return *result;
}

CheckpointIndex SeedIndex(uint64_t file_bytes) {
  CheckpointIndex idx;
  idx.checkpoint_id = fuzz::kShardSeedId;
  idx.world_size = 1;
  idx.state.step = 7;
  CheckpointFile f;
  f.name = ShardFileName(0);
  f.elements = fuzz::kShardSeedElems;
  f.bytes = file_bytes;
  uint32_t crc[3];
  for (int k = 0; k < 3; k++) {
    std::vector<float> v(fuzz::kShardSeedElems);
    for (uint64_t i = 0; i < v.size(); i++) v[i] = fuzz::ShardSeedValue(k, i);
    crc[k] = Crc32c(0, v.data(), v.size() * sizeof(float));
  }
  f.crc_master = crc[0], f.crc_m = crc[1], f.crc_v = crc[2];
  for (int k = 0; k < 3; k++) f.chunk_offsets[k] = SeedChunks().chunk_offsets[k], f.chunk_crcs[k] = SeedChunks().chunk_crcs[k];
  idx.files.push_back(f);
  return idx;
}

void CheckValues(int k, uint64_t offset, const std::vector<float>& got) {
  for (size_t i = 0; i < got.size(); i++) {
    const float want = fuzz::ShardSeedValue(k, offset + i);
    FUZZ_CHECK(std::memcmp(&want, &got[i], 4) == 0, "dataset %d element %zu differs", k, offset + i);
  }
}

void ReadShard(const uint8_t* data, size_t size) {
  const std::string path = fuzz::WriteInput(ShardFileName(0), data, size);
  const CheckpointIndex idx = SeedIndex(size);
  {
    ShardFileReader reader;
    Status st = reader.Open(path, idx, 0);
    if (st.ok()) {
      const int k = static_cast<int>(size % 3);
      const uint64_t off = (size / 3) % fuzz::kShardSeedElems;
      const uint64_t cnt = 1 + (size / 7) % (fuzz::kShardSeedElems - off);
      std::vector<float> got(cnt);
      st = reader.Read(k, off, cnt, got.data());
      if (st.ok()) CheckValues(k, off, got);
    }
    if (!st.ok()) fuzz::CheckError(st, path);
  }
  uint64_t bytes = 0;
  const Status st = VerifyShardFile(path, idx, 0, &bytes);
  if (!st.ok()) {
    fuzz::CheckError(st, path);
    return;
  }
  FUZZ_CHECK(bytes == 3 * 4 * fuzz::kShardSeedElems, "verified %llu bytes", static_cast<unsigned long long>(bytes));
  ShardFileReader reader;
  FUZZ_CHECK(reader.Open(path, idx, 0).ok(), "verified file does not open");
  for (int k = 0; k < 3; k++) {
    std::vector<float> got(fuzz::kShardSeedElems);
    FUZZ_CHECK(reader.Read(k, 0, got.size(), got.data()).ok(), "verified file does not read");
    CheckValues(k, 0, got);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ReadShard(data, size);
  FUZZ_CHECK_NO_OPEN_HDF5();
  return 0;
}
