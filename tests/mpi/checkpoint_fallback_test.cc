// --resume auto's building blocks on 1..3 ranks:
//  - the one rule for DIR/latest, a case per test (missing, a name, empty, another name, a
//    dangling symlink, a symlink loop, a directory, a FIFO, a missing or incomplete step, a good
//    symlink): ResolveCheckpoint (an explicit choice) refuses every unusable one naming it,
//    ListResumeCandidates (auto) says what is wrong and lists the complete steps newest first;
//  - a damaged checkpoint (a byte of master, m or v, the index, a missing, truncated or
//    foreign shard file) fails its load with the same LoadProblem on every rank, and the next
//    load of another checkpoint gives bitwise the state a fresh engine loads from it directly
//    (nothing of the failed one survives), here on another stage than the save (resharding);
//  - keep_last neither counts nor prunes `.bad-*` directories; QuarantineCheckpoint never
//    overwrites an earlier quarantined one.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "model/gpt.h"
#include "parallel/mpi_communicator.h"
#include "tests/mpi/checkpoint_harness.h"

namespace shardgpt {
namespace {

namespace fs = std::filesystem;
using namespace ckpt_harness;  // the shared setup (checkpoint_harness.h)

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

// A byte in the middle of the first chunk of `dataset` of a shard file (the index's offsets).
void FlipByteInData(const std::string& step_dir, int file, int dataset) {
  auto idx = ReadCheckpointIndex(step_dir);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  const CheckpointFile& f = idx->files[file];
  ASSERT_FALSE(f.chunk_offsets[dataset].empty());
  const uint64_t at = f.chunk_offsets[dataset][0] + 40;
  std::fstream io(step_dir + "/" + f.name, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  char ch = 0;
  io.read(&ch, 1);
  ch ^= 0x04;
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&ch, 1);
}

void FlipByteAt(const std::string& path, uint64_t at) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  char ch = 0;
  io.read(&ch, 1);
  ch ^= 0x01;
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&ch, 1);
}

// ---- the rule for latest (local: each rank in its own directory) ----

TEST(Latest, OneRuleForEveryCase) {
  char tmpl[] = "/tmp/ckfb_latest_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string d = tmpl;
  for (const char* s : {"step_00000002", "step_00000004"}) {  // "complete": they have index.h5
    fs::create_directories(d + "/" + s);
    WriteText(d + "/" + s + "/index.h5", "x");
  }
  fs::create_directories(d + "/step_00000006");                  // incomplete (no index)
  fs::create_directories(d + "/step_00000008.bad-checksum");     // quarantined: never a candidate
  WriteText(d + "/step_00000008.bad-checksum/index.h5", "x");
  const std::vector<std::string> newest_first = {d + "/step_00000004", d + "/step_00000002"};

  // no latest at all (a crash before the first one): the newest complete step, no problem
  auto r = ResolveCheckpoint("latest", d);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value(), d + "/step_00000004");
  ResumeCandidates c = ListResumeCandidates(d);
  EXPECT_EQ(c.dirs, newest_first);
  EXPECT_EQ(c.latest_problem, "");

  // latest names a complete step: that one first, then the others newest first
  WriteText(d + "/latest", "step_00000002\n");
  r = ResolveCheckpoint("latest", d);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value(), d + "/step_00000002");
  EXPECT_EQ(ResolveCheckpoint(d, "").value(), d + "/step_00000002");  // a --ckpt-dir as PATH: the same
  c = ListResumeCandidates(d);
  EXPECT_EQ(c.dirs, (std::vector<std::string>{d + "/step_00000002", d + "/step_00000004"}));
  EXPECT_EQ(c.latest_problem, "");

  // a symlink to a file holding a good name is read like the file
  WriteText(d + "/name.txt", "step_00000002\n");
  fs::remove(d + "/latest");
  fs::create_symlink("name.txt", d + "/latest");
  r = ResolveCheckpoint("latest", d);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value(), d + "/step_00000002");

  // every unusable latest: an error naming it for an explicit choice (never another
  // checkpoint instead), and for auto the same line as the problem, with all complete steps
  struct Case {
    const char* what;
    std::function<void()> make;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"empty", [&] { WriteText(d + "/latest", ""); }, "latest: empty"},
      {"blank", [&] { WriteText(d + "/latest", " \n\n"); }, "latest: empty"},
      {"another name", [&] { WriteText(d + "/latest", "../outside\n"); }, "latest: names '../outside'"},
      {"dangling symlink", [&] { fs::create_symlink("nowhere", d + "/latest"); }, "latest: a dangling symlink (to 'nowhere'"},
      {"symlink loop", [&] { fs::create_symlink("latest", d + "/latest"); }, "latest: a symlink loop"},
      {"directory", [&] { fs::create_directory(d + "/latest"); }, "latest: is a directory"},
      {"fifo", [&] { mkfifo((d + "/latest").c_str(), 0600); }, "latest: not a regular file"},  // must not block
      {"missing step", [&] { WriteText(d + "/latest", "step_00000010\n"); }, "latest: names step_00000010, which does not exist"},
      {"incomplete step", [&] { WriteText(d + "/latest", "step_00000006\n"); }, "latest: names step_00000006, which has no index.h5"},
      {"quarantined step", [&] { WriteText(d + "/latest", "step_00000008.bad-checksum\n"); },
       "latest: names 'step_00000008.bad-checksum'"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    fs::remove_all(d + "/latest");
    k.make();
    r = ResolveCheckpoint("latest", d);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kCorruption);
    EXPECT_NE(r.status().message().find(d + "/" + k.expect), std::string::npos) << r.status().message();
    auto as_path = ResolveCheckpoint(d, "");  // a --ckpt-dir given as PATH follows the same rule
    ASSERT_FALSE(as_path.ok());
    EXPECT_EQ(as_path.status().message(), r.status().message());
    c = ListResumeCandidates(d);
    EXPECT_EQ(c.latest_problem, r.status().message());
    EXPECT_EQ(c.dirs, newest_first);
  }
  fs::remove_all(d);
}

// ---- a damaged candidate, then another: nothing of the first survives ----

TEST(Fallback, DamageIsNamedOnEveryRankAndTheNextLoadIsClean) {
  const int rank = WorldRank();
  const std::string dir = SharedDir("fb_dmg");
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int save_stage = 1, load_stage = world > 1 ? 3 : 0;  // another stage: other owned pieces
  auto a = MakeRun(MPI_COMM_WORLD, SmallConfig(), save_stage, 3);
  Train(*a, 2);
  ASSERT_TRUE(SaveCheckpoint(dir, StateOf(*a), *a->engine, *a->layout, *a->comm, 0, true).ok());
  Train(*a, 2);
  ASSERT_TRUE(SaveCheckpoint(dir, StateOf(*a), *a->engine, *a->layout, *a->comm, 0, true).ok());
  const std::string good = dir + "/step_00000002", newest = dir + "/step_00000004";
  if (rank == 0) fs::copy(newest, dir + "/pristine");
  // the reference: a fresh engine that loads step 2 directly
  auto ref = MakeRun(MPI_COMM_WORLD, SmallConfig(), load_stage, 9);
  ASSERT_TRUE(LoadCheckpoint(good, dir, *ref->engine, *ref->layout, *ref->comm, true).ok());
  const std::vector<uint32_t> want = FullState(*ref);
  const int last = world - 1;
  struct Case {
    const char* what;
    std::function<void()> damage;  // on rank 0, to a fresh copy of step 4
    LoadProblem problem;
    const char* names;  // in the message
  };
  const std::string shard0 = newest + "/rank_00000.h5", shard_last = newest + "/" + ShardFileName(last);
  const std::vector<Case> cases = {
      {"master", [&] { FlipByteInData(newest, 0, 0); }, LoadProblem::kChecksum, "rank_00000.h5"},
      {"m", [&] { FlipByteInData(newest, last, 1); }, LoadProblem::kChecksum, "/m"},
      {"v", [&] { FlipByteInData(newest, 0, 2); }, LoadProblem::kChecksum, "/v"},
      {"index", [&] { FlipByteAt(newest + "/index.h5", 300); }, LoadProblem::kIndex, "index.h5"},
      {"missing shard", [&] { fs::remove(shard_last); }, LoadProblem::kMissingShard, "shard file missing"},
      {"truncated shard", [&] { fs::resize_file(shard0, fs::file_size(shard0) - 100); }, LoadProblem::kTruncatedShard,
       "truncated"},
      {"shard header", [&] { FlipByteAt(shard0, 60); }, LoadProblem::kShardHeader, "rank_00000.h5"},
  };
  auto b = MakeRun(MPI_COMM_WORLD, SmallConfig(), load_stage, 11);
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      fs::remove_all(newest);
      fs::copy(dir + "/pristine", newest);
      k.damage();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    LoadProblem p = LoadProblem::kNone;
    auto bad = LoadCheckpoint(newest, dir, *b->engine, *b->layout, *b->comm, true, &p);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(p, k.problem) << LoadProblemName(p) << ": " << bad.status().message();
    EXPECT_TRUE(IsCheckpointDamage(p));
    EXPECT_NE(bad.status().message().find(k.names), std::string::npos) << bad.status().message();
    // every rank holds the same problem and message
    const int code = static_cast<int>(p);
    int lo = code, hi = code;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi);
    LoadProblem q = LoadProblem::kNone;
    auto ok = LoadCheckpoint(good, dir, *b->engine, *b->layout, *b->comm, true, &q);
    ASSERT_TRUE(ok.ok()) << ok.status().ToString();
    EXPECT_EQ(q, LoadProblem::kNone);
    EXPECT_EQ(ok->step, 2);
    EXPECT_TRUE(FullState(*b) == want) << "state after a failed load then a good one differs from a direct load";
  }
  // another model is about the run, not the files: not damage
  auto other = MakeRun(MPI_COMM_WORLD, SmallConfig(3), load_stage, 1);
  LoadProblem p = LoadProblem::kNone;
  EXPECT_FALSE(LoadCheckpoint(good, dir, *other->engine, *other->layout, *other->comm, true, &p).ok());
  EXPECT_EQ(p, LoadProblem::kRun);
  EXPECT_FALSE(IsCheckpointDamage(p));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

// ---- quarantine and keep_last ----

TEST(Fallback, KeepLastIgnoresQuarantinedAndNamesNeverCollide) {
  const int rank = WorldRank();
  const std::string dir = SharedDir("fb_keep");
  auto a = MakeRun(MPI_COMM_WORLD, SmallConfig(), 1, 3);
  for (int s = 0; s < 3; s++) {
    Train(*a, 1);
    ASSERT_TRUE(SaveCheckpoint(dir, StateOf(*a), *a->engine, *a->layout, *a->comm, 0, true).ok());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    auto q = QuarantineCheckpoint(dir + "/step_00000003", "checksum");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q.value(), dir + "/step_00000003.bad-checksum");
    // the same step damaged again later: a new name, the first one kept
    fs::create_directories(dir + "/step_00000003");
    WriteText(dir + "/step_00000003/index.h5", "x");
    q = QuarantineCheckpoint(dir + "/step_00000003", "checksum");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q.value(), dir + "/step_00000003.bad-checksum-2");
    EXPECT_TRUE(fs::exists(dir + "/step_00000003.bad-checksum/index.h5"));
    ASSERT_TRUE(PointLatestAt(dir, "step_00000002").ok());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ResolveCheckpoint("latest", dir).value(), dir + "/step_00000002");
  // keep_last 2 at step 4: step 4 and step 2 stay (the .bad ones are not counted), step 1 goes
  a->steps = 4;
  ASSERT_TRUE(SaveCheckpoint(dir, StateOf(*a), *a->engine, *a->layout, *a->comm, 2, true).ok());
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(fs::exists(dir + "/step_00000004/index.h5"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000002/index.h5"));
  EXPECT_FALSE(fs::exists(dir + "/step_00000001"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000003.bad-checksum/index.h5"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000003.bad-checksum-2/index.h5"));
  // keep_last 1: only the newest (the one just saved) stays; the quarantined ones still do
  a->steps = 5;
  ASSERT_TRUE(SaveCheckpoint(dir, StateOf(*a), *a->engine, *a->layout, *a->comm, 1, true).ok());
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(fs::exists(dir + "/step_00000005/index.h5"));
  EXPECT_FALSE(fs::exists(dir + "/step_00000004"));
  EXPECT_FALSE(fs::exists(dir + "/step_00000002"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000003.bad-checksum"));
  EXPECT_TRUE(fs::exists(dir + "/step_00000003.bad-checksum-2"));
  EXPECT_EQ(ListResumeCandidates(dir).dirs, std::vector<std::string>{dir + "/step_00000005"});
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace shardgpt
