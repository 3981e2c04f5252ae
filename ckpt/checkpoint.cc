#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <cstdlib>

#include "base/clock.h"
#include "ckpt/checkpoint_h5.h"
#include "ckpt/checkpoint_shard.h"

namespace shardgpt {

namespace fs = std::filesystem;
using h5::Id;

namespace {

constexpr const char* kIndexName = "index.h5";
constexpr const char* kLatestName = "latest";

bool fail_next_save = false;
// Test hooks between this rank's shard file and the index, where a kill or a signal must land
// inside a write (tests/e2e/async_ckpt.sh, sigint.sh):
// SHARDGPT_TEST_CKPT_WRITE_DELAY_MS=N: every write pauses N ms (a slow file system);
// SHARDGPT_TEST_CKPT_HOLD=STEP:PATH: the write of step STEP's checkpoint waits until PATH
// exists, so the test decides when it ends, whatever the machine's speed.
const int write_delay_ms = [] {
  const char* v = std::getenv("SHARDGPT_TEST_CKPT_WRITE_DELAY_MS");
  return v != nullptr ? std::atoi(v) : 0;
}();
void TestHoldWrite(int64_t step) {
  const char* v = std::getenv("SHARDGPT_TEST_CKPT_HOLD");
  const char* colon = v != nullptr ? std::strchr(v, ':') : nullptr;
  if (colon == nullptr || std::atoll(v) != step) return;
  const fs::path release(colon + 1);
  std::error_code ec;
  while (!fs::exists(release, ec)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}


std::string Errno() { return std::strerror(errno); }

Status FsyncPath(const std::string& p, bool dir) {
  const int fd = open(p.c_str(), O_RDONLY | (dir ? O_DIRECTORY : 0));
  if (fd < 0) return Status::IOError(p + ": cannot open for fsync: " + Errno());
  const int rc = fsync(fd);
  const std::string err = rc != 0 ? Errno() : "";
  close(fd);
  if (rc != 0) return Status::IOError(p + ": fsync failed: " + err);
  return Status::OK();
}

Status MakeStatus(int code, std::string msg) {
  switch (static_cast<Status::Code>(code)) {
    case Status::Code::kInvalidArgument: return Status::InvalidArgument(std::move(msg));
    case Status::Code::kNotFound: return Status::NotFound(std::move(msg));
    case Status::Code::kCorruption: return Status::Corruption(std::move(msg));
    case Status::Code::kIOError: return Status::IOError(std::move(msg));
    case Status::Code::kUnimplemented: return Status::Unimplemented(std::move(msg));
    default: return Status::Internal(std::move(msg));
  }
}

// ---- agreement over ranks ----

// Every rank returns an error when any rank has one, all with the message of the lowest
// failing rank (so whichever rank the caller prints from names the file).
Status AgreeAll(Communicator& comm, const Status& local, uint64_t tag = 0, uint64_t* agreed_tag = nullptr) {
  if (comm.AllTrue(local.ok())) return Status::OK();
  const std::vector<uint64_t> failed = AllGatherU64(comm, {local.ok() ? 0u : 1u});
  int speaker = 0;
  while (speaker < comm.world_size() && failed[speaker] == 0) speaker++;
  if (speaker == comm.world_size()) return Status::Internal("checkpoint: communication failed");
  uint64_t hdr[3] = {0, 0, 0};
  if (comm.rank() == speaker) hdr[0] = local.message().size(), hdr[1] = static_cast<uint64_t>(local.code()), hdr[2] = tag;
  comm.ControlBroadcast(hdr, sizeof(hdr), speaker);
  if (agreed_tag != nullptr) *agreed_tag = hdr[2];  // the speaker's: the same on every rank
  std::vector<char> buf(hdr[0] + 1, '\0');
  if (comm.rank() == speaker) std::memcpy(buf.data(), local.message().data(), hdr[0]);
  comm.ControlBroadcast(buf.data(), buf.size(), speaker);
  return MakeStatus(static_cast<int>(hdr[1]), std::string(buf.data(), hdr[0]));
}

Status CheckLayout(const CheckpointIndex& idx, const ParamLayout& layout, const std::string& where) {
  if (std::string diff = idx.config.FirstDifference(layout.config()); !diff.empty())
    return Status::InvalidArgument(where + ": checkpoint is for another model config: " + diff +
                                   " (checkpoint vs this run)");
  const auto& ts = layout.tensors();
  if (idx.tensors.size() != ts.size() || idx.units.size() != layout.units().size())
    return Status::Corruption(where + ": parameter layout has " + std::to_string(idx.tensors.size()) + " tensors in " +
                              std::to_string(idx.units.size()) + " units, expected " + std::to_string(ts.size()) +
                              " in " + std::to_string(layout.units().size()));
  for (size_t i = 0; i < ts.size(); i++) {
    const TensorInfo& a = idx.tensors[i];
    if (a.name != ts[i].name || a.unit != ts[i].unit || a.offset != ts[i].offset || a.numel != ts[i].numel ||
        a.shape != ts[i].shape)
      return Status::Corruption(where + ": tensor " + std::to_string(i) + " '" + a.name +
                                "' differs from this build's parameter layout ('" + ts[i].name + "')");
  }
  for (size_t u = 0; u < layout.units().size(); u++)
    if (idx.units[u].numel != layout.units()[u].numel || idx.units[u].offset != layout.units()[u].offset)
      return Status::Corruption(where + ": unit " + std::to_string(u) + " differs from this build's layout");
  return Status::OK();
}

// ---- publishing ----


// Replaces `name` inside `dir` with a small text file atomically (temp file, fsync, rename).
Status WriteSmallFileAtomic(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/." + name + ".tmp", path = dir + "/" + name;
  {  // write(2) and close(2) checked one by one, so the error names the errno (ENOSPC, EDQUOT, EIO)
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IOError(tmp + ": cannot create: " + Errno());
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string err = n < 0 ? Errno() : std::strerror(ENOSPC);
        close(fd);
        std::remove(tmp.c_str());
        return Status::IOError(tmp + ": cannot write: " + err);
      }
      done += static_cast<size_t>(n);
    }
    if (close(fd) != 0) {
      const std::string err = Errno();
      std::remove(tmp.c_str());
      return Status::IOError(tmp + ": cannot write: " + err);
    }
  }
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(tmp, false));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::IOError(path + ": rename failed: " + Errno());
  return FsyncPath(dir, true);
}

// Moves a directory out of the way atomically, then deletes it: a crash mid-delete never
// leaves a step_* directory with an index but without some shard files.
void RemoveDirSafely(const std::string& dir, const std::string& path) {
  std::error_code ec;
  const std::string trash = dir + "/.trash." + fs::path(path).filename().string();
  fs::remove_all(trash, ec);
  if (std::rename(path.c_str(), trash.c_str()) == 0) fs::remove_all(trash, ec);
}

// Rank 0: moves the finished temp directory into place, points latest at it, prunes.
Status Publish(const std::string& dir, const std::string& tmp, const std::string& final_dir, const std::string& name,
               int keep_last) {
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(tmp, true));
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // Same step saved again (e.g. after a resume): swap atomically so the directory is
    // never missing, then delete the old one (now at tmp).
    if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      SHARDGPT_RETURN_IF_ERROR(FsyncPath(dir, true));
      fs::remove_all(tmp, ec);
    } else {
      RemoveDirSafely(dir, final_dir);
      if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
        return Status::IOError(final_dir + ": rename from " + tmp + " failed: " + Errno());
    }
  } else if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return Status::IOError(final_dir + ": rename from " + tmp + " failed: " + Errno());
  }
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(dir, true));
  SHARDGPT_RETURN_IF_ERROR(WriteSmallFileAtomic(dir, kLatestName, name + "\n"));
  if (keep_last > 0) {
    std::vector<std::pair<int64_t, std::string>> complete;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const int64_t s = ParseStepDirName(e.path().filename().string());
      if (s >= 0 && e.is_directory() && fs::exists(e.path() / kIndexName))
        complete.emplace_back(s, e.path().string());
    }
    std::sort(complete.rbegin(), complete.rend());
    int kept = 0;
    for (const auto& c : complete) {
      if (c.second == final_dir || kept < keep_last - 1) {
        if (c.second != final_dir) kept++;
        continue;
      }
      RemoveDirSafely(dir, c.second);
    }
    FsyncPath(dir, true);
  }
  return Status::OK();
}

// Rank 0, before a save: creates DIR, removes what crashed saves left behind, creates tmp.
Status PrepareSave(const std::string& dir, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) return Status::IOError(dir + ": cannot create the checkpoint directory");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp.", 0) == 0 || n.rfind(".trash.", 0) == 0) fs::remove_all(e.path(), ec);
  }
  if (!fs::create_directory(tmp, ec)) return Status::IOError(tmp + ": cannot create: " + ec.message());
  return Status::OK();
}

uint64_t RandomId() {
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (t * 0x9E3779B97F4A7C15ull)) | 1;
}

std::string Gbps(double bytes, double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", s > 0 ? bytes / s / 1e9 : 0.0);
  return buf;
}

// The one rule for DIR/latest (docs/CHECKPOINT.md, "Which checkpoint a resume reads"): no
// entry at all (lstat finds nothing: a crash before the first save published one) sets
// *exists = false; any entry is read as a file (a symlink is followed, as open() does) and
// must hold one step_XXXXXXXX name (the file may come from elsewhere: "../x" or "/abs" must not
// lead outside DIR) of a directory that has index.h5. Anything else (empty, another name, a
// dangling symlink, a symlink loop, a directory, an unreadable file, a missing or incomplete
// step directory) is a Corruption naming DIR/latest and what is wrong with it.
Status ReadLatestTarget(const std::string& root, bool* exists, std::string* dir) {
  const std::string path = root + "/" + kLatestName;
  struct stat lsb;
  *exists = lstat(path.c_str(), &lsb) == 0;
  if (!*exists) {
    if (errno == ENOENT) return Status::OK();
    return Status::IOError(path + ": cannot stat: " + Errno());
  }
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block
  if (fd < 0) {
    const int e = errno;
    if (S_ISLNK(lsb.st_mode) && e == ELOOP) return Status::Corruption(path + ": a symlink loop (expected a file naming a step_XXXXXXXX directory)");
    if (S_ISLNK(lsb.st_mode) && e == ENOENT) {
      std::error_code ec;
      return Status::Corruption(path + ": a dangling symlink (to '" + fs::read_symlink(path, ec).string() +
                                "'; expected a file naming a step_XXXXXXXX directory)");
    }
    return Status::Corruption(path + ": cannot open: " + std::strerror(e));
  }
  struct stat sb;
  std::string text;
  char buf[256];
  ssize_t n = 0;
  const bool stated = fstat(fd, &sb) == 0, is_dir = stated && S_ISDIR(sb.st_mode), is_file = stated && S_ISREG(sb.st_mode);
  if (is_file)
    while (text.size() <= 128 && (n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  const int read_errno = errno;
  close(fd);
  if (is_dir) return Status::Corruption(path + ": is a directory (expected a file naming a step_XXXXXXXX directory)");
  if (!is_file) return Status::Corruption(path + ": not a regular file (expected a file naming a step_XXXXXXXX directory)");
  if (n < 0) return Status::Corruption(path + ": cannot read: " + std::strerror(read_errno));
  const size_t b = text.find_first_not_of(" \t\r\n");
  const std::string name = b == std::string::npos ? "" : text.substr(b, text.find_first_of(" \t\r\n", b) - b);
  if (name.empty()) return Status::Corruption(path + ": empty (expected the name of a step_XXXXXXXX directory)");
  if (name.size() > 64 || ParseStepDirName(name) < 0 || StepDirName(ParseStepDirName(name)) != name)
    return Status::Corruption(path + ": names '" + name.substr(0, 64) + "' (expected a step_XXXXXXXX directory name)");
  std::error_code ec;
  *dir = root + "/" + name;
  if (!fs::is_directory(*dir, ec)) return Status::Corruption(path + ": names " + name + ", which does not exist");
  if (!fs::exists(fs::path(*dir) / kIndexName, ec))
    return Status::Corruption(path + ": names " + name + ", which has no " + kIndexName + " (an incomplete save)");
  return Status::OK();
}

bool LatestEntryExists(const std::string& root) {
  struct stat sb;
  return lstat((root + "/" + kLatestName).c_str(), &sb) == 0;
}

// The complete step_* directories of root (those with index.h5), newest first.
std::vector<std::string> CompleteStepDirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = ParseStepDirName(e.path().filename().string());
    if (s >= 0 && e.is_directory(ec) && fs::exists(e.path() / kIndexName, ec)) found.emplace_back(s, e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

// The engine's owned state in the order of this rank's shard file: its pieces of the saving
// plan, concatenated (stage 0: sub-ranges of the full units). Copies through the device.
ShardFill EngineFill(Engine& engine, const std::vector<SavedPiece>& pieces, int rank) {
  std::vector<SavedPiece> mine;
  for (const SavedPiece& p : pieces)
    if (p.file == rank) mine.push_back(p);  // in file_offset order (PlanSave's order)
  return [&engine, mine, rank](int k, uint64_t at, uint64_t count, float* dst) -> Status {
    // the last piece starting at or before `at`, then onwards
    size_t pi = static_cast<size_t>(std::upper_bound(mine.begin(), mine.end(), at,
                                                     [](uint64_t a, const SavedPiece& p) { return a < p.file_offset; }) -
                                    mine.begin());
    for (const uint64_t stop = at + count; at < stop; pi++) {
      if (pi == 0 || pi > mine.size()) return Status::Internal("checkpoint: shard element " + std::to_string(at) +
                                                              " is in no piece of rank " + std::to_string(rank));
      const SavedPiece& p = mine[pi - 1];
      // the engine piece holding this saved piece (the same piece at stage >= 1, the whole
      // unit at stage 0)
      const std::vector<Engine::OwnedState> owned = engine.OwnedPieces(p.unit);
      auto it = std::find_if(owned.begin(), owned.end(),
                             [&](const Engine::OwnedState& o) { return o.begin <= p.begin && p.end <= o.end; });
      if (it == owned.end())
        return Status::Internal("checkpoint: unit " + std::to_string(p.unit) + " piece not owned by rank " +
                                std::to_string(rank));
      const Engine::OwnedState& st = *it;
      const float* base = k == 0 ? st.master : k == 1 ? st.m : st.v;
      const uint64_t unit_at = p.begin + (at - p.file_offset);
      const uint64_t cnt = std::min<uint64_t>(stop, p.file_offset + (p.end - p.begin)) - at;
      engine.device().CopyToHost(dst, base + (unit_at - st.begin), cnt * sizeof(float));
      at += cnt;
      dst += cnt;
    }
    return Status::OK();
  };
}

}  // namespace

void FailNextSaveBeforeIndexForTesting() { fail_next_save = true; }

StatusOr<std::string> ResolveCheckpoint(const std::string& path, const std::string& ckpt_dir) {
  std::error_code ec;
  std::string root;
  if (path == kLatestName) {
    if (ckpt_dir.empty()) return Status::InvalidArgument("checkpoint 'latest' needs a checkpoint directory (--ckpt-dir)");
    root = ckpt_dir;
    if (!fs::is_directory(root, ec)) return Status::NotFound(root + ": no checkpoint directory");
  } else {
    if (!fs::exists(path, ec)) return Status::NotFound(path + ": no such checkpoint directory");
    if (fs::is_regular_file(path, ec) && fs::path(path).filename() == kIndexName)
      return fs::path(path).parent_path().string();
    if (!fs::is_directory(path, ec)) return Status::InvalidArgument(path + ": not a checkpoint directory");
    if (fs::exists(fs::path(path) / kIndexName, ec)) return path;
    if (!LatestEntryExists(path))
      return Status::InvalidArgument(path + ": not a checkpoint (no " + kIndexName + ")");
    root = path;
  }
  bool exists = false;
  std::string dir;
  SHARDGPT_RETURN_IF_ERROR(ReadLatestTarget(root, &exists, &dir));
  if (exists) return dir;
  // No latest entry (a crash before the first one was written): the newest complete step.
  const std::vector<std::string> steps = CompleteStepDirs(root);
  if (steps.empty()) return Status::NotFound(root + ": no checkpoint (no latest file, no complete step_* directory)");
  return steps.front();
}

ResumeCandidates ListResumeCandidates(const std::string& ckpt_dir) {
  ResumeCandidates c;
  bool exists = false;
  std::string first;
  const Status st = ReadLatestTarget(ckpt_dir, &exists, &first);
  if (!st.ok()) c.latest_problem = st.message();
  if (st.ok() && exists) c.dirs.push_back(first);
  for (std::string& d : CompleteStepDirs(ckpt_dir))
    if (d != first || !st.ok()) c.dirs.push_back(std::move(d));
  return c;
}

StatusOr<std::string> QuarantineCheckpoint(const std::string& dir, const std::string& reason) {
  std::string to = dir + ".bad-" + reason;
  std::error_code ec;
  for (int k = 2; fs::exists(fs::symlink_status(to, ec)); k++) to = dir + ".bad-" + reason + "-" + std::to_string(k);
  if (std::rename(dir.c_str(), to.c_str()) != 0) return Status::IOError(dir + ": cannot rename to " + to + ": " + Errno());
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(fs::path(dir).parent_path().string(), true));
  return to;
}

Status PointLatestAt(const std::string& ckpt_dir, const std::string& step_dir_name) {
  return WriteSmallFileAtomic(ckpt_dir, kLatestName, step_dir_name + "\n");
}

const char* LoadProblemName(LoadProblem p) {
  switch (p) {
    case LoadProblem::kNone: return "none";
    case LoadProblem::kIndex: return "index";
    case LoadProblem::kMissingShard: return "missing-shard";
    case LoadProblem::kTruncatedShard: return "shard-size";
    case LoadProblem::kShardHeader: return "shard-header";
    case LoadProblem::kChecksum: return "checksum";
    case LoadProblem::kRun: return "run";
  }
  return "run";
}

StatusOr<GPTConfig> ReadCheckpointConfig(const std::string& path, const std::string& ckpt_dir) {
  auto dir = ResolveCheckpoint(path, ckpt_dir);
  if (!dir.ok()) return dir.status();
  auto idx = ReadCheckpointIndex(dir.value());
  if (!idx.ok()) return idx.status();
  return idx->config;
}

uint64_t OwnedShardElements(const ParamLayout& layout, const SaveRole& role) {
  uint64_t elements = 0;
  for (const SavedPiece& p : PlanSave(layout, role.files, role.shard_layout))
    if (p.file == role.file) elements = std::max(elements, p.file_offset + (p.end - p.begin));
  return elements;
}

Status CopyOwnedShard(Engine& engine, const ParamLayout& layout, const SaveRole& role, float* out) {
  const uint64_t n = OwnedShardElements(layout, role);
  const ShardFill fill = EngineFill(engine, PlanSave(layout, role.files, role.shard_layout), role.file);
  for (int k = 0; k < 3; k++) SHARDGPT_RETURN_IF_ERROR(fill(k, 0, n, out + k * n));
  return Status::OK();
}

SaveRole SaveRoleOf(const Engine& engine) {
  SaveRole role;
  role.zero_stage = engine.options().zero_stage;
  role.dtype = engine.options().dtype;
  role.optimizer = engine.options().optimizer;
  role.shard_layout = engine.options().shard_layout;
  role.files = engine.shard_group_size();
  role.file = engine.shard_rank();
  // HSDP: the replicas of a shard (one per group) hold bitwise-equal state (the cross-group
  // all-reduce gives each the same averaged gradient, and AdamW is deterministic), so only
  // group 0 (world ranks 0..G-1, which include rank 0, the index writer) writes: G files, file
  // f from world rank f. Without HSDP, G = N and every rank writes.
  role.writer = engine.group_index() == 0;
  return role;
}

Status SaveCheckpoint(const std::string& dir, const TrainState& state, Engine& engine, const ParamLayout& layout,
                      Communicator& comm, int keep_last, bool quiet) {
  const SaveRole role = SaveRoleOf(engine);
  return SaveCheckpointFrom(dir, state, layout, role, EngineFill(engine, PlanSave(layout, role.files, role.shard_layout), role.file), comm,
                            keep_last, quiet);
}

Status SaveCheckpointFrom(const std::string& dir, const TrainState& state, const ParamLayout& layout,
                          const SaveRole& role, const ShardFill& fill, Communicator& comm, int keep_last, bool quiet) {
  h5::InitH5();
  const double t_start = MonotonicSeconds();
  const int rank = comm.rank(), ranks = comm.world_size(), world = role.files;
  const std::string name = StepDirName(state.step);
  const std::string tmp = dir + "/.tmp." + name, final_dir = dir + "/" + name;

  uint64_t id[1] = {rank == 0 ? RandomId() : 0};
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, rank == 0 ? PrepareSave(dir, tmp) : Status::OK()));
  comm.ControlBroadcast(id, sizeof(id), 0);

  const std::vector<SavedPiece> pieces = PlanSave(layout, world, role.shard_layout);
  ShardWriteResult res;
  const std::string shard_path = tmp + "/" + ShardFileName(role.file);
  const uint64_t elements = OwnedShardElements(layout, role);
  Status written = role.writer ? WriteShardFile(shard_path, role.file, world, id[0], state.step, elements, fill, &res)
                                : Status::OK();
  if (written.ok() && role.writer && write_delay_ms > 0)  // test hook: a slow file system, so a kill can land here
    std::this_thread::sleep_for(std::chrono::milliseconds(write_delay_ms));
  if (written.ok() && role.writer) TestHoldWrite(state.step);
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, written));
  uint64_t secs_bits;
  std::memcpy(&secs_bits, &res.seconds, sizeof(double));
  const std::vector<uint64_t> all = AllGatherU64(
      comm, {res.elements, res.bytes, (uint64_t{res.crc[0]} << 32) | res.crc[1], res.crc[2], secs_bits});
  // Every rank's chunk table (file offsets of its chunks, per dataset), padded to the longest.
  uint64_t max_chunks = 0;
  for (int r = 0; r < world; r++) max_chunks = std::max(max_chunks, ShardChunks(all[5 * r]));
  std::vector<uint64_t> my_offsets(6 * max_chunks, 0);  // offsets, then CRCs, of master, m, v
  for (int k = 0; k < 3; k++) {
    std::copy(res.chunk_offsets[k].begin(), res.chunk_offsets[k].end(), my_offsets.begin() + k * max_chunks);
    std::copy(res.chunk_crcs[k].begin(), res.chunk_crcs[k].end(), my_offsets.begin() + (3 + k) * max_chunks);
  }
  const std::vector<uint64_t> offsets = max_chunks > 0 ? AllGatherU64(comm, my_offsets) : std::vector<uint64_t>();

  Status st;
  if (fail_next_save) {
    fail_next_save = false;
    st = Status::IOError(tmp + ": simulated crash before the index was written (test hook)");
  } else if (rank == 0) {
    CheckpointIndex idx;
    idx.format_version = kCheckpointFormatVersion;
    idx.checkpoint_id = id[0];
    idx.config = layout.config();
    idx.tensors = layout.tensors();
    idx.units = layout.units();
    idx.world_size = world;
    idx.ranks = ranks;
    idx.shard_group_size = world;
    idx.zero_stage = role.zero_stage;
    idx.dtype = DTypeName(role.dtype);
    idx.optimizer = OptimizerName(role.optimizer);
    idx.state = state;
    idx.shard_layout = ShardLayoutName(role.shard_layout);
    idx.pieces = pieces;
    idx.chunks = ChunksFromPieces(layout, pieces);
    for (int r = 0; r < world; r++) {
      const uint64_t* a = &all[5 * r];
      CheckpointFile f{ShardFileName(r), a[0], a[1], static_cast<uint32_t>(a[2] >> 32),
                       static_cast<uint32_t>(a[2]), static_cast<uint32_t>(a[3]), {}, {}};
      for (int k = 0; k < 3; k++) {
        const uint64_t* o = offsets.data() + (6 * r + k) * max_chunks;
        const uint64_t* c = offsets.data() + (6 * r + 3 + k) * max_chunks;
        f.chunk_offsets[k].assign(o, o + ShardChunks(a[0]));
        f.chunk_crcs[k].assign(c, c + ShardChunks(a[0]));
      }
      idx.files.push_back(std::move(f));
    }
    st = WriteCheckpointIndex(tmp + "/" + kIndexName, idx);  // LAST: its presence marks the checkpoint complete
    if (st.ok()) st = Publish(dir, tmp, final_dir, name, keep_last);
  }
  SHARDGPT_RETURN_IF_ERROR(AgreeAll(comm, st));
  if (rank == 0 && !quiet) {
    const double wall = MonotonicSeconds() - t_start;
    double total = 0;
    std::string per_rank;
    for (int r = 0; r < world; r++) {
      const uint64_t* a = &all[5 * r];
      double s;
      std::memcpy(&s, &a[4], sizeof(double));
      const double b = static_cast<double>(a[0]) * 3 * sizeof(float);
      total += b;
      per_rank += " " + Gbps(b, s);
    }
    std::printf("checkpoint: saved %s (%d file(s)%s, %.3f GB of fp32 state) in %.3f s: %s GB/s total; per rank GB/s:%s\n",
                final_dir.c_str(), world, world < ranks ? ", written by group 0 of the HSDP groups" : "", total / 1e9, wall, Gbps(total, wall).c_str(), per_rank.c_str());
    std::fflush(stdout);
  }
  return Status::OK();
}

StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm) {
  return LoadCheckpoint(path, ckpt_dir, engine, layout, comm, false);
}

StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm, bool quiet) {
  LoadProblem problem;
  return LoadCheckpoint(path, ckpt_dir, engine, layout, comm, quiet, &problem);
}

StatusOr<TrainState> LoadCheckpoint(const std::string& path, const std::string& ckpt_dir, Engine& engine,
                                    const ParamLayout& layout, Communicator& comm, bool quiet, LoadProblem* problem) {
  h5::InitH5();
  const double t_start = MonotonicSeconds();
  *problem = LoadProblem::kNone;
  // this rank's problem kind, agreed with the message (the lowest failing rank's, on every rank)
  LoadProblem mine = LoadProblem::kNone;
  auto agree = [&](const Status& local) {
    uint64_t tag = 0;
    Status st = AgreeAll(comm, local, static_cast<uint64_t>(mine), &tag);
    if (!st.ok()) *problem = static_cast<LoadProblem>(tag);
    return st;
  };
  // 1. Everything checkable without reading data, before the engine is touched.
  CheckpointIndex idx;
  Status st = [&]() -> Status {
    mine = LoadProblem::kRun;
    auto dir = ResolveCheckpoint(path, ckpt_dir);
    if (!dir.ok()) return dir.status();
    auto read = ReadCheckpointIndex(dir.value());
    // an index format this build does not read is not damage (another build reads it)
    if (!read.ok() && read.status().code() != Status::Code::kUnimplemented) mine = LoadProblem::kIndex;
    if (!read.ok()) return read.status();
    mine = LoadProblem::kRun;
    idx = std::move(read.value());
    SHARDGPT_RETURN_IF_ERROR(CheckLayout(idx, layout, idx.dir + "/" + kIndexName));
    // Muon's momentum is not AdamW's first moment (and Muon keeps no second moment there).
    const std::string want = OptimizerName(engine.options().optimizer);
    if (idx.optimizer != want)
      return Status::InvalidArgument(idx.dir + "/" + kIndexName + ": saved by --optimizer " + idx.optimizer +
                                     ", this run uses --optimizer " + want + " (its optimizer state cannot continue " +
                                     "as the other's; resume with --optimizer " + idx.optimizer + ")");
    for (const CheckpointFile& f : idx.files) {
      Status size = CheckShardFileSize(idx.dir + "/" + f.name, f.bytes);
      mine = size.code() == Status::Code::kNotFound ? LoadProblem::kMissingShard : LoadProblem::kTruncatedShard;
      SHARDGPT_RETURN_IF_ERROR(size);
    }
    mine = LoadProblem::kNone;
    return Status::OK();
  }();
  SHARDGPT_RETURN_IF_ERROR(agree(st));

  // 2. What this rank reads: the saved pieces intersecting each Owned(u) range, by file.
  struct Job {
    ReadOp op;
    float* dst[3];
  };
  std::map<int, std::vector<Job>> by_file;
  for (int u = 0; u < layout.num_units(); u++)
    for (const Engine::OwnedState& own : engine.OwnedPieces(u))
      for (const ReadOp& op : PlanReads(idx.pieces, u, own.begin, own.end))
        by_file[op.file].push_back(
            Job{op, {own.master + op.dest_offset, own.m + op.dest_offset, own.v + op.dest_offset}});
  // Open every needed file first (ids, dataset lengths), so a bad file fails before any data moves.
  std::map<int, ShardFileReader> readers;
  st = Status::OK();
  for (auto& [f, jobs] : by_file) {
    st = readers[f].Open(idx.dir + "/" + idx.files[f].name, idx, f);
    if (!st.ok()) break;
  }
  mine = st.ok() ? LoadProblem::kNone : LoadProblem::kShardHeader;
  SHARDGPT_RETURN_IF_ERROR(agree(st));

  // 3. Hyperslab reads straight into the engine's buffers (through host memory for a GPU).
  const double t_read = MonotonicSeconds();
  uint64_t bytes = 0;
  Device& device = engine.device();
  std::vector<float> host;
  for (auto& [f, jobs] : by_file) {
    for (int k = 0; k < 3 && st.ok(); k++)
      for (const Job& j : jobs) {
        if (device.host_accessible()) {
          st = readers[f].Read(k, j.op.file_offset, j.op.count, j.dst[k]);
        } else {
          host.resize(j.op.count);
          st = readers[f].Read(k, j.op.file_offset, j.op.count, host.data());
          if (st.ok()) device.CopyToDevice(j.dst[k], host.data(), j.op.count * sizeof(float));
        }
        if (!st.ok()) break;
        bytes += j.op.count * sizeof(float);
      }
    readers.erase(f);  // close each file when done: bounded chunk caches
    if (!st.ok()) break;
  }
  const double read_s = MonotonicSeconds() - t_read;
  mine = st.ok() ? LoadProblem::kNone : LoadProblem::kChecksum;
  SHARDGPT_RETURN_IF_ERROR(agree(st));
  // commit: only now, with every rank's data read and checked, the step and working parameters

  engine.set_step_count(idx.state.step);
  engine.SyncParamsFromMaster();
  uint64_t secs_bits;
  std::memcpy(&secs_bits, &read_s, sizeof(double));
  const std::vector<uint64_t> all = AllGatherU64(comm, {bytes, secs_bits});
  if (comm.rank() == 0 && !quiet) {
    const double wall = MonotonicSeconds() - t_start;
    double total = 0;
    std::string per_rank;
    for (int r = 0; r < comm.world_size(); r++) {
      double s;
      std::memcpy(&s, &all[2 * r + 1], sizeof(double));
      total += static_cast<double>(all[2 * r]);
      per_rank += " " + Gbps(static_cast<double>(all[2 * r]), s);
    }
    std::printf("checkpoint: loaded %s (saved by %d rank(s), shard groups of %d, stage %d, %s layout; step %lld) on %d "
                "rank(s), shard groups of %d, stage %d, %s layout: %.3f GB read in %.3f s: %s GB/s total; per rank GB/s:%s\n",
                idx.dir.c_str(), idx.ranks, idx.shard_group_size, idx.zero_stage, idx.shard_layout.c_str(),
                static_cast<long long>(idx.state.step), comm.world_size(), engine.shard_group_size(),
                engine.options().zero_stage, ShardLayoutName(engine.options().shard_layout), total / 1e9, wall,
                Gbps(total, wall).c_str(),
                per_rank.c_str());
    std::fflush(stdout);
  }
  return idx.state;
}

// The index of the checkpoint `path` names, checked against the layout its config implies
// (the common start of verify and of reading a full model without a training run).
// The index of the checkpoint `path` names (validated in itself by ReadCheckpointIndex), and
// every shard file present at its recorded size: the common start of verify and of reading a
// full model without a training run. Nothing is allocated for the model before the files
// on disk are known to hold it.
static StatusOr<CheckpointIndex> OpenCheckedIndex(const std::string& path) {
  auto dir = ResolveCheckpoint(path, "");
  if (!dir.ok()) return dir.status();
  auto read = ReadCheckpointIndex(dir.value());
  if (!read.ok()) return read.status();
  const CheckpointIndex& idx = read.value();
  for (const CheckpointFile& f : idx.files)
    SHARDGPT_RETURN_IF_ERROR(CheckShardFileSize(idx.dir + "/" + f.name, f.bytes));
  return read;
}

Status VerifyCheckpoint(const std::string& path, CheckpointIndex* index, uint64_t* bytes_read) {
  auto read = OpenCheckedIndex(path);
  if (!read.ok()) return read.status();
  const CheckpointIndex& idx = read.value();
  uint64_t total = 0;
  for (size_t i = 0; i < idx.files.size(); i++)
    SHARDGPT_RETURN_IF_ERROR(VerifyShardFile(idx.dir + "/" + idx.files[i].name, idx, static_cast<int>(i), &total));
  if (index != nullptr) *index = idx;
  if (bytes_read != nullptr) *bytes_read = total;
  return Status::OK();
}

StatusOr<LlmcModel> LoadCheckpointFullModel(const std::string& path) {
  auto read = OpenCheckedIndex(path);
  if (!read.ok()) return read.status();
  const CheckpointIndex& idx = read.value();
  const ParamLayout layout(idx.config);
  LlmcModel model;
  model.config = idx.config;
  model.params.assign(layout.total_numel(), 0.0f);  // = the files' elements, whose sizes were checked
  for (int f = 0; f < idx.world_size; f++) {
    ShardFileReader reader;
    SHARDGPT_RETURN_IF_ERROR(reader.Open(idx.dir + "/" + idx.files[f].name, idx, f));
    for (const SavedPiece& p : idx.pieces) {
      if (p.file != f) continue;
      float* dst = model.params.data() + layout.units()[p.unit].offset + p.begin;
      SHARDGPT_RETURN_IF_ERROR(reader.Read(0, p.file_offset, p.end - p.begin, dst));
    }
  }
  return model;
}

Status WriteFullModelH5(const std::string& path, const ParamLayout& layout, const float* params) {
  h5::InitH5();
  const std::string tmp = path + ".tmp";
  // parameters plus HDF5's metadata (an object header and two attributes per tensor)
  const uint64_t needed = layout.total_numel() * sizeof(float) + layout.tensors().size() * 2048 + 16384;
  struct RemoveUnlessKept {  // a failed export leaves no e.h5.tmp behind
    const std::string& path;
    bool keep = false;
    ~RemoveUnlessKept() {
      if (!keep) std::remove(path.c_str());
    }
  } partial{tmp};
  {
    Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) return h5::WriteError(tmp, "cannot create", needed);
    SHARDGPT_RETURN_IF_ERROR(h5::ReserveSpace(tmp, needed));
    const GPTConfig& c = layout.config();
    bool ok = h5::WriteAttrStr(file.get(), "format", "shardgpt-model") &&
              h5::WriteAttrI64(file.get(), "n_layer", c.n_layer) && h5::WriteAttrI64(file.get(), "n_head", c.n_head) &&
              h5::WriteAttrI64(file.get(), "n_embd", c.n_embd) &&
              h5::WriteAttrI64(file.get(), "max_seq_len", c.max_seq_len) &&
              h5::WriteAttrI64(file.get(), "vocab_size", c.vocab_size) &&
              h5::WriteAttrI64(file.get(), "padded_vocab_size", c.padded_vocab()) &&
              h5::WriteLlamaConfig(file.get(), c);
    for (const TensorInfo& t : layout.tensors()) {
      if (!ok) break;
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
      Id dset(H5Dcreate2(file.get(), t.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                         H5P_DEFAULT),
              H5Dclose);
      const size_t global = layout.units()[t.unit].offset + t.offset;
      ok = dset.valid() &&
           H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, params + global) >= 0 &&
           h5::WriteAttrI64(dset.get(), "unit", t.unit) && h5::WriteAttrI64(dset.get(), "offset", global);
    }
    if (!ok) return h5::WriteError(tmp, "cannot write", needed);
    if (!file.Close()) return h5::WriteError(tmp, "cannot close", needed);
  }
  h5::ReleaseReserve(tmp);
  SHARDGPT_RETURN_IF_ERROR(FsyncPath(tmp, false));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::IOError(path + ": rename failed: " + Errno());
  partial.keep = true;
  return Status::OK();
}

}  // namespace shardgpt
