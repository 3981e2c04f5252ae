// Checkpoint planning without MPI or HDF5: the saved pieces cover every unit exactly once
// with nothing written twice, and for every saving world x loading world x stage the reads a
// rank plans fill exactly its range, touch only the files that hold it, and are minimal.
#include "ckpt/checkpoint_plan.h"

#include <gtest/gtest.h>

#include <vector>
#include <hdf5.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "parallel/shard_plan.h"

namespace shardgpt {
namespace {

GPTConfig Small() {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.max_seq_len = 64;
  c.vocab_size = 256;
  return c;
}

std::vector<uint64_t> UnitNumel(const ParamLayout& L) {
  std::vector<uint64_t> n;
  for (const UnitInfo& u : L.units()) n.push_back(u.numel);
  return n;
}

constexpr ShardLayout kLayouts[] = {ShardLayout::kFlat, ShardLayout::kPerParam};

TEST(CheckpointPlan, SavedPiecesCoverEveryUnitOnce) {
  const ParamLayout L(Small());
  for (ShardLayout sl : kLayouts)
    for (int world = 1; world <= 7; world++) {
      const auto pieces = PlanSave(L, world, sl);
      EXPECT_TRUE(CheckPieces(pieces, UnitNumel(L), world).ok()) << world;
      const auto elems = FileElements(pieces, world);
      uint64_t total = 0;
      for (uint64_t e : elems) total += e;
      EXPECT_EQ(total, L.total_numel()) << "nothing written twice, no padding, world " << world;
      // File r holds exactly ShardPlan's owned pieces of rank r, in order.
      const ShardPlan plan(L, world, sl);
      std::vector<SavedPiece> want;
      for (int r = 0; r < world; r++)
        for (int u = 0; u < plan.num_units(); u++)
          for (const OwnedPiece& p : plan.OwnedPieces(u, r)) want.push_back(SavedPiece{u, r, p.begin, p.end, 0});
      ASSERT_EQ(pieces.size(), want.size());
      for (size_t i = 0; i < pieces.size(); i++) {
        EXPECT_EQ(pieces[i].file, want[i].file);
        EXPECT_EQ(pieces[i].unit, want[i].unit);
        EXPECT_EQ(pieces[i].begin, want[i].begin);
        EXPECT_EQ(pieces[i].end, want[i].end);
      }
    }
}

// Pieces as per-parameter chunks (the index's form): each chunk a contiguous box of one
// tensor; back in unit coordinates they tile the pieces exactly, file offsets included. A flat
// piece that starts and ends inside rows of a 2-D tensor is a partial row, whole rows and a
// partial row; a per-param piece (whole rows) is one chunk.
TEST(CheckpointPlan, ChunksAreBoxesOfOneTensorThatTileThePieces) {
  const ParamLayout L(Small());
  for (ShardLayout sl : kLayouts)
    for (int world = 1; world <= 7; world++) {
      const auto pieces = PlanSave(L, world, sl);
      const auto chunks = ChunksFromPieces(L, pieces);
      std::vector<SavedPiece> back;
      for (const SavedChunk& c : chunks) {
        SavedPiece p;
        ASSERT_TRUE(PieceOfChunk(L, c, world, &p).ok());
        back.push_back(p);
      }
      EXPECT_TRUE(CheckPieces(back, UnitNumel(L), world).ok());
      EXPECT_EQ(FileElements(back, world), FileElements(pieces, world));
      if (sl == ShardLayout::kPerParam) EXPECT_EQ(chunks.size(), pieces.size()) << "world " << world;
    }
  // wte of Small() is [Vp, C]: elements [C + 3, 5C - 2) are row 1 from column 3, rows 2-3, row 4
  // up to column C - 2.
  const uint64_t C = static_cast<uint64_t>(L.config().n_embd);
  const auto chunks = ChunksFromPieces(L, {SavedPiece{0, 0, C + 3, 5 * C - 2, 100}});
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].offsets, (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(chunks[0].sizes, (std::vector<uint64_t>{1, C - 3}));
  EXPECT_EQ(chunks[0].file_offset, 100u);
  EXPECT_EQ(chunks[1].offsets, (std::vector<uint64_t>{2, 0}));
  EXPECT_EQ(chunks[1].sizes, (std::vector<uint64_t>{2, C}));
  EXPECT_EQ(chunks[1].file_offset, 100u + C - 3);
  EXPECT_EQ(chunks[2].offsets, (std::vector<uint64_t>{4, 0}));
  EXPECT_EQ(chunks[2].sizes, (std::vector<uint64_t>{1, C - 2}));
  EXPECT_EQ(chunks[2].file_offset, 100u + 3 * C - 3);
}

TEST(CheckpointPlan, CheckPiecesNamesTheProblem) {
  const ParamLayout L(Small());
  auto pieces = PlanSave(L, 2);
  auto dup = pieces;
  dup.push_back(pieces[0]);
  Status st = CheckPieces(dup, UnitNumel(L), 2);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("stored twice"), std::string::npos) << st.message();
  auto gap = pieces;
  gap.erase(gap.begin());
  st = CheckPieces(gap, UnitNumel(L), 2);
  EXPECT_NE(st.message().find("missing"), std::string::npos) << st.message();
  auto bad_file = pieces;
  bad_file[0].file = 5;
  st = CheckPieces(bad_file, UnitNumel(L), 2);
  EXPECT_NE(st.message().find("no such file"), std::string::npos) << st.message();
}

// Simulates loading: fill each target range from "files" whose element i of file f is a
// tag (f, i), and check every element lands where the unit coordinate says.
TEST(CheckpointPlan, ReadsFillAnyTargetRangeExactly) {
  const ParamLayout L(Small());
  for (ShardLayout saved_layout : kLayouts)
  for (ShardLayout target_layout : kLayouts)
  for (int saved = 1; saved <= 5; saved++) {
    const auto pieces = PlanSave(L, saved, saved_layout);
    // unit coordinate of every file element, to check the placement
    std::vector<std::vector<std::pair<int, uint64_t>>> file_elems(saved);
    const auto elems = FileElements(pieces, saved);
    for (int f = 0; f < saved; f++) file_elems[f].resize(elems[f]);
    for (const SavedPiece& p : pieces)
      for (uint64_t i = p.begin; i < p.end; i++) file_elems[p.file][p.file_offset + i - p.begin] = {p.unit, i};
    for (int target = 1; target <= 5; target++) {
      const ShardPlan plan(L, target, target_layout);
      for (int stage : {0, 1}) {
        for (int r = 0; r < target; r++) {
          for (int u = 0; u < L.num_units(); u++) {
           std::vector<OwnedPiece> targets = plan.OwnedPieces(u, r);
           if (stage == 0) targets = {OwnedPiece{0, L.units()[u].numel, 0}};
           for (const OwnedPiece& tp : targets) {
            const uint64_t b = tp.begin, e = tp.end;
            const auto ops = PlanReads(pieces, u, b, e);
            std::vector<int> hit(e - b, 0);
            std::set<int> files;
            for (const ReadOp& op : ops) {
              files.insert(op.file);
              for (uint64_t i = 0; i < op.count; i++) {
                ASSERT_LT(op.dest_offset + i, e - b);
                hit[op.dest_offset + i]++;
                const auto& where = file_elems[op.file][op.file_offset + i];
                ASSERT_EQ(where.first, u);
                ASSERT_EQ(where.second, b + op.dest_offset + i);
              }
            }
            for (int h : hit) ASSERT_EQ(h, 1) << "saved " << saved << " target " << target << " unit " << u;
            // Only the files whose pieces intersect the range; one read per such file.
            std::set<int> need;
            for (const SavedPiece& p : pieces)
              if (p.unit == u && p.begin < e && b < p.end) need.insert(p.file);
            EXPECT_EQ(files, need);
            // flat pieces merge into one read per file; per-param files hold several
            // pieces of a unit (one per tensor), read one by one
            if (saved_layout == ShardLayout::kFlat) EXPECT_EQ(ops.size(), need.size());
           }
          }
        }
      }
    }
  }
}

TEST(CheckpointPlan, SameWorldReadsOneOwnFilePiece) {
  const ParamLayout L(Small());
  for (ShardLayout sl : kLayouts) {
    const auto pieces = PlanSave(L, 3, sl);
    const ShardPlan plan(L, 3, sl);
    for (int r = 0; r < 3; r++)
      for (int u = 0; u < L.num_units(); u++)
        for (const OwnedPiece& p : plan.OwnedPieces(u, r)) {
          const auto ops = PlanReads(pieces, u, p.begin, p.end);
          ASSERT_EQ(ops.size(), 1u);
          EXPECT_EQ(ops[0].file, r);
          EXPECT_EQ(ops[0].count, p.end - p.begin);
        }
  }
}

TEST(CheckpointPlan, Crc32cAndStepNames) {
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(Crc32c(Crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, "", 0), 0u);
  // Combining the CRCs of two parts gives the CRC of the whole, for any split and length.
  EXPECT_EQ(Crc32cCombine(Crc32c(0, "1234", 4), Crc32c(0, "56789", 5), 5), 0xE3069283u);
  std::vector<unsigned char> data(10000);
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{9999}, size_t{10000}})
    EXPECT_EQ(Crc32cCombine(Crc32c(0, data.data(), split), Crc32c(0, data.data() + split, data.size() - split),
                            data.size() - split),
              Crc32c(0, data.data(), data.size()))
        << split;
  EXPECT_EQ(StepDirName(42), "step_00000042");
  EXPECT_EQ(ParseStepDirName("step_00000042"), 42);
  EXPECT_EQ(ParseStepDirName("step_123456789"), 123456789);
  EXPECT_EQ(ParseStepDirName("step_"), -1);
  EXPECT_EQ(ParseStepDirName("step_12a"), -1);
  EXPECT_EQ(ParseStepDirName(".tmp.step_00000001"), -1);
}

// Our Fletcher32 must be bit-identical to what HDF5's filter appends (chunks are written
// pre-filtered). Write through the filter, read the raw chunk back, compare its trailer.
TEST(CheckpointPlan, Fletcher32MatchesHdf5Filter) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string path = (std::filesystem::temp_directory_path() / "fletcher_test.h5").string();
  for (hsize_t n : {hsize_t{1}, hsize_t{7}, hsize_t{180}, hsize_t{181}, hsize_t{1000}, hsize_t{100003}}) {
    std::vector<float> data(n);
    for (hsize_t i = 0; i < n; i++) data[i] = static_cast<float>(i) * -1.37e-3f + (i % 3 ? 1e30f : -0.0f);
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &n);
    H5Pset_fletcher32(dcpl);
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t d = H5Dcreate2(f, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    H5Dclose(d);
    d = H5Dopen2(f, "x", H5P_DEFAULT);
    std::vector<uint8_t> raw(n * 4 + 4);
    const hsize_t offset = 0;
    uint32_t mask = 0;
    ASSERT_GE(H5Dread_chunk(d, H5P_DEFAULT, &offset, &mask, raw.data()), 0);
    const uint32_t stored = raw[n * 4] | (raw[n * 4 + 1] << 8) | (raw[n * 4 + 2] << 16) |
                            (static_cast<uint32_t>(raw[n * 4 + 3]) << 24);
    EXPECT_EQ(Fletcher32(data.data(), n * 4), stored) << n;
    EXPECT_EQ(0, std::memcmp(raw.data(), data.data(), n * 4));
    H5Dclose(d);
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Fclose(f);
  }
  std::remove(path.c_str());
  const char odd[3] = {1, 2, 3};  // odd lengths as HDF5 (last byte as a high half-word)
  EXPECT_EQ(Fletcher32(odd, 3), ((0x0102u + (0x0102u + 0x0300u)) << 16) | (0x0102u + 0x0300u));
}

}  // namespace
}  // namespace shardgpt
