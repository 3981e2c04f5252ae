#include "ckpt/checkpoint_manager.h"

#include <cstdio>
#include <filesystem>

#include "base/clock.h"
#include "ckpt/async_checkpoint.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_plan.h"
#include "ckpt/ckpt_dir_lock.h"

namespace shardgpt {

namespace {

// What an explicit --resume choice (latest, PATH) that is damaged says after its error.
constexpr const char* kAutoHint = " (--resume auto falls back to the newest checkpoint that loads)";


// Rank 0's list of --resume auto candidates, on every rank (ranks on several nodes list the
// shared directory at slightly different moments; one listing keeps them on the same one).
ResumeCandidates BroadcastCandidates(Communicator& comm, const std::string& ckpt_dir) {
  ResumeCandidates c;
  std::string text;
  if (comm.rank() == 0) {
    c = ListResumeCandidates(ckpt_dir);
    text = c.latest_problem;
    for (const std::string& d : c.dirs) text += "\n" + d;
  }
  uint64_t n = text.size();
  comm.ControlBroadcast(&n, sizeof(n), 0);
  text.resize(n);
  if (n > 0) comm.ControlBroadcast(text.data(), n, 0);
  if (comm.rank() != 0) {
    size_t at = text.find('\n');
    c.latest_problem = text.substr(0, at);
    while (at != std::string::npos) {
      const size_t next = text.find('\n', at + 1);
      c.dirs.push_back(text.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
      at = next;
    }
  }
  return c;
}

}  // namespace

CheckpointManager::CheckpointManager(CheckpointOptions options, Communicator& comm)
    : o_(std::move(options)), comm_(comm), lead_(comm.rank() == 0) {}

CheckpointManager::~CheckpointManager() = default;

std::string CheckpointManager::FlightDir(const CheckpointOptions& o) { return o.dir.empty() ? "" : o.dir + "/flight"; }

std::string CheckpointManager::LatestPath(const CheckpointOptions& o) { return o.dir.empty() ? "" : o.dir + "/latest"; }

Status CheckpointManager::ValidateOptions(const CheckpointOptions& o) {
  if (o.async && o.dir.empty()) return Status::InvalidArgument("--async-ckpt needs --ckpt-dir (where to write checkpoints)");
  if (o.every > 0 && o.dir.empty())
    return Status::InvalidArgument("--ckpt-every needs --ckpt-dir (where to write checkpoints)");
  if (o.fail_limit < 1)
    return Status::InvalidArgument("--ckpt-fail-limit " + std::to_string(o.fail_limit) +
                                   ": expected >= 1 failed saves in a row before the run ends");
  if (o.keep_last > 0 && o.dir.empty())
    return Status::InvalidArgument("--keep-last " + std::to_string(o.keep_last) +
                                   " needs --ckpt-dir (the checkpoints it keeps)");
  return Status::OK();
}

Status CheckpointManager::PlanResume(const GPTConfig& model) {
  if (o_.resume.empty()) return Status::OK();
  // "auto" is the requeue idiom: the newest checkpoint under --ckpt-dir if there is one, else a
  // fresh start. "latest" insists on one (a missing checkpoint there is a mistake to report).
  const bool auto_resume = o_.resume == "auto";
  if ((o_.resume == "latest" || auto_resume) && o_.dir.empty())
    return Status::InvalidArgument("--resume " + o_.resume + " needs --ckpt-dir (where to look for the latest checkpoint)");
  if (auto_resume) {
    // The model config of each candidate is checked by LoadCheckpoint, before it touches the
    // engine: another model stops the run there, damage moves on to the next candidate.
    ResumeCandidates c = BroadcastCandidates(comm_, o_.dir);
    candidates_ = std::move(c.dirs);
    latest_problem_ = std::move(c.latest_problem);
    if (candidates_.empty() && lead_) {
      if (!latest_problem_.empty())
        std::fprintf(stderr, "shardgpt: warning: --resume auto: %s; no complete step_* directory either\n",
                     latest_problem_.c_str());
      std::printf("--resume auto: no checkpoint in %s yet, starting from step 0 on %d rank(s)\n", o_.dir.c_str(),
                  comm_.world_size());
      std::fflush(stdout), std::fflush(stderr);
    }
    return Status::OK();
  }
  auto where = ResolveCheckpoint(o_.resume, o_.dir);
  if (where.ok()) {
    resume_path_ = where.value();
    auto saved = ReadCheckpointConfig(resume_path_, o_.dir);
    if (!saved.ok() && saved.status().code() == Status::Code::kCorruption)
      return Agree(comm_, Status::Corruption(saved.status().message() + kAutoHint));
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, saved.status()));
    const std::string diff = saved->FirstDifference(model);
    if (!diff.empty())
      return Status::InvalidArgument(resume_path_ + ": checkpoint is for another model (" + diff +
                                     ", checkpoint vs this run)");
  } else if (o_.resume == "latest" && where.status().code() == Status::Code::kNotFound) {
    return Agree(comm_, Status::NotFound(where.status().message() + " (--resume auto starts fresh when there is none)"));
  } else if (where.status().code() == Status::Code::kCorruption) {  // an unusable latest
    return Agree(comm_, Status::Corruption(where.status().message() + kAutoHint));
  } else {
    return Agree(comm_, where.status());
  }
  return Status::OK();
}

Status CheckpointManager::Open(Device& device) {
  if (!enabled()) return Status::OK();
  Status st;
  if (lead_) {  // one job per directory, writable: found now, not at the first save
    auto lock = CheckpointDirLock::Acquire(o_.dir);
    if (lock.ok()) lock_ = std::move(lock.value());
    else st = lock.status();
  }
  SHARDGPT_RETURN_IF_ERROR(Agree(comm_, st));
  if (o_.async) {
    auto a = AsyncCheckpointer::Create(comm_, device, o_.dir, o_.keep_last, o_.quiet);
    if (a.ok()) async_ = std::move(a.value());
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, a.status()));
  }
  return Status::OK();
}

// Every rank has the same statuses (LoadCheckpoint agrees them), so all take the same path.
Status CheckpointManager::LoadAuto(Engine& engine, const ParamLayout& layout, TrainState* state) {
  if (lead_ && !latest_problem_.empty()) {
    std::fprintf(stderr, "shardgpt: warning: --resume auto: %s; trying the complete step_* directories, newest first\n",
                 latest_problem_.c_str());
    std::fflush(stderr);
  }
  std::vector<Skipped> skipped;
  for (const std::string& dir : candidates_) {
    LoadProblem problem = LoadProblem::kNone;
    auto loaded = LoadCheckpoint(dir, o_.dir, engine, layout, comm_, o_.quiet, &problem);
    if (loaded.ok()) {
      resume_path_ = dir;
      *state = loaded.value();
      break;
    }
    if (!IsCheckpointDamage(problem)) return Agree(comm_, loaded.status());
    skipped.push_back({dir, LoadProblemName(problem), loaded.status().message(), ""});
  }
  if (resume_path_.empty()) {  // nothing renamed: a later --resume auto must not start from step 0
    std::string line = "--resume auto: no checkpoint in " + o_.dir + " loads (nothing renamed):";
    for (const Skipped& s : skipped) line += " " + s.dir + " (" + s.reason + ": " + s.error + ");";
    line.pop_back();
    return Agree(comm_, Status::Corruption(lead_ ? line : ""));
  }
  nlohmann::json record = {{"from", resume_path_}, {"skipped", nlohmann::json::array()}};
  if (!latest_problem_.empty()) record["latest_problem"] = latest_problem_;
  if (lead_) {
    for (Skipped& s : skipped) {
      auto to = QuarantineCheckpoint(s.dir, s.reason);
      if (to.ok()) s.renamed_to = to.value();
      std::fprintf(stderr, "shardgpt: warning: --resume auto: skipped %s (%s): %s; %s\n", s.dir.c_str(), s.reason.c_str(),
                   s.error.c_str(), to.ok() ? ("renamed to " + s.renamed_to).c_str()
                                            : ("not renamed: " + to.status().message()).c_str());
      record["skipped"].push_back({{"dir", s.dir}, {"reason", s.reason}, {"error", s.error}, {"renamed_to", s.renamed_to}});
    }
    if (!skipped.empty() || !latest_problem_.empty()) {
      const Status st = PointLatestAt(o_.dir, resume_path_.substr(resume_path_.rfind('/') + 1));
      if (!st.ok()) std::fprintf(stderr, "shardgpt: warning: --resume auto: %s\n", st.message().c_str());
    }
    std::fflush(stderr);
  }
  resume_record_ = record;
  skipped_ = std::move(skipped);
  return Status::OK();
}

Status CheckpointManager::Load(Engine& engine, const ParamLayout& layout, TrainState* state) {
  if (!candidates_.empty()) return LoadAuto(engine, layout, state);
  if (resume_path_.empty()) return Status::OK();
  LoadProblem problem = LoadProblem::kNone;
  auto loaded = LoadCheckpoint(resume_path_, o_.dir, engine, layout, comm_, o_.quiet, &problem);
  if (!loaded.ok() && IsCheckpointDamage(problem))
    return Agree(comm_, Status::Corruption(loaded.status().message() + kAutoHint));
  SHARDGPT_RETURN_IF_ERROR(Agree(comm_, loaded.status()));
  *state = loaded.value();
  resume_record_ = {{"from", resume_path_}, {"skipped", nlohmann::json::array()}};
  return Status::OK();
}

std::string CheckpointManager::ResumeDetails() const {
  std::string out;
  auto index = ReadCheckpointIndex(resume_path_);
  if (index.ok()) {
    out += " (saved by " + std::to_string(index->ranks) + " rank(s), zero stage " + std::to_string(index->zero_stage);
    if (index->shard_group_size < index->ranks) out += ", shard groups of " + std::to_string(index->shard_group_size);
    out += ")";
  }
  for (size_t i = 0; i < skipped_.size(); i++)
    out += std::string(i == 0 ? "; skipped damaged: " : ", ") + skipped_[i].dir + " (" + skipped_[i].reason +
           (skipped_[i].renamed_to.empty() ? "" : ", now ") + skipped_[i].renamed_to + ")";
  return out;
}

bool CheckpointManager::DuePeriodic(int64_t step, int64_t last_step) const {
  return o_.every > 0 && step % o_.every == 0 && step < last_step;
}

Status CheckpointManager::Tolerate(int64_t step, const Status& st) {
  failed_in_a_row_++;
  const std::string why = st.message().empty() ? "the error is on rank 0's line" : st.message();
  failures_.push_back({step, why});
  if (lead_) {  // what a crashed save would leave: the next PrepareSave would remove it too
    std::error_code ec;
    std::filesystem::remove_all(o_.dir + "/.tmp." + StepDirName(step), ec);
  }
  if (failed_in_a_row_ >= o_.fail_limit) {
    fail_limit_reached_ = true;
    if (!lead_) return Status::IOError("");  // the line is rank 0's
    return Status::IOError("checkpoint saves failed " + std::to_string(failed_in_a_row_) + " time(s) in a row (" +
                           "--ckpt-fail-limit " + std::to_string(o_.fail_limit) + "; the last, of step " +
                           std::to_string(step) + ": " + why + "): ending the run with status 75 for a requeue; " +
                           o_.dir + "/latest is unchanged");
  }
  std::fprintf(stderr,
               "shardgpt: warning: rank %d: checkpoint of step %lld not saved (%s); %s/latest is unchanged, training "
               "goes on and the next save tries again (%d of --ckpt-fail-limit %d in a row)\n",
               comm_.rank(), static_cast<long long>(step), why.c_str(), o_.dir.c_str(), failed_in_a_row_, o_.fail_limit);
  std::fflush(stderr);
  return Status::OK();
}

Status CheckpointManager::Save(const TrainState& state, Engine& engine, const ParamLayout& layout, bool background,
                               bool periodic) {
  if (!enabled()) return Status::OK();
  const double t0 = MonotonicSeconds();
  saved_ = true;
  auto tolerable = [](const Status& st) { return st.code() == Status::Code::kIOError; };
  if (!async_) {
    // SaveCheckpoint's error is the same on every rank (code and message): each decides alike
    Status st = SaveCheckpoint(o_.dir, state, engine, layout, comm_, o_.keep_last, o_.quiet);
    stall_ms_ += (MonotonicSeconds() - t0) * 1e3;
    write_ms_ = (MonotonicSeconds() - t0) * 1e3;
    if (st.ok()) failed_in_a_row_ = 0;
    else if (periodic && tolerable(st)) st = Tolerate(state.step, st);
    return Agree(comm_, st);
  }
  // the background save before this one: its result first (agreed by the writer)
  Status previous = async_->Wait();
  if (pending_step_ >= 0) {
    if (previous.ok()) failed_in_a_row_ = 0;
    else if (pending_periodic_ && tolerable(previous)) previous = Tolerate(pending_step_, previous);
    pending_step_ = -1;
  }
  Status st = previous;
  if (st.ok()) st = async_->Save(state, engine, layout);
  if (st.ok()) pending_step_ = state.step, pending_periodic_ = periodic && background;
  if (st.ok() && !background) {
    st = async_->Wait();
    pending_step_ = -1;
    if (st.ok()) failed_in_a_row_ = 0;
    else if (periodic && tolerable(st)) st = Tolerate(state.step, st);
  }
  stall_ms_ += (MonotonicSeconds() - t0) * 1e3;
  return Agree(comm_, st);
}

void CheckpointManager::WaitStaged() {
  if (!async_) return;
  const double t0 = MonotonicSeconds();
  async_->WaitStaged();
  stall_ms_ += (MonotonicSeconds() - t0) * 1e3;
}

CheckpointManager::Cost CheckpointManager::TakeCost() {
  if (async_) {
    const double w = async_->TakeWriteMs();
    if (w >= 0) write_ms_ = w;
  }
  Cost c{saved_, stall_ms_, write_ms_, std::move(failures_)};
  stall_ms_ = 0, write_ms_ = -1, saved_ = false, failures_.clear();
  return c;
}

}  // namespace shardgpt
