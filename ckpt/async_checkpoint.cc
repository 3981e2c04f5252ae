#include "ckpt/async_checkpoint.h"

#include <chrono>
#include <cstring>

#include "ckpt/checkpoint.h"

namespace shardgpt {

namespace {
double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

StatusOr<std::unique_ptr<AsyncCheckpointer>> AsyncCheckpointer::Create(Communicator& comm, Device& device,
                                                                       std::string dir, int keep_last, bool quiet) {
  auto control = comm.DuplicateControl();
  if (!control.ok()) return Status::Unimplemented("--async-ckpt: " + control.status().message());
  return std::unique_ptr<AsyncCheckpointer>(
      new AsyncCheckpointer(std::move(control.value()), device, std::move(dir), keep_last, quiet));
}

AsyncCheckpointer::AsyncCheckpointer(std::unique_ptr<Communicator> control, Device& device, std::string dir,
                                     int keep_last, bool quiet)
    : control_(std::move(control)), device_(device), dir_(std::move(dir)), keep_last_(keep_last), quiet_(quiet) {
  thread_ = std::thread([this] { Loop(); });
}

AsyncCheckpointer::~AsyncCheckpointer() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !has_job_ && !busy_; });  // the save in flight ends on every rank
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (staging_ != nullptr) device_.FreeHost(staging_);
}

Status AsyncCheckpointer::Wait() {
  const double t0 = NowMs();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !has_job_ && !busy_; });
  stall_ms_ = NowMs() - t0;
  Status st = result_;
  result_ = Status::OK();
  return st;
}

void AsyncCheckpointer::WaitStaged() {
  const double t0 = NowMs();
  std::unique_lock<std::mutex> lock(mu_);
  if (staged_) return;
  cv_.wait(lock, [this] { return staged_; });
  stall_ms_ += NowMs() - t0;
}

double AsyncCheckpointer::TakeWriteMs() {
  std::lock_guard<std::mutex> lock(mu_);
  const double ms = write_ms_;
  write_ms_ = -1;
  return ms;
}

Status AsyncCheckpointer::Save(const TrainState& state, Engine& engine, const ParamLayout& layout) {
  const double t0 = NowMs();
  Status previous = Wait();  // one save in flight: the staging buffer is free after this
  if (!previous.ok()) return previous;  // agreed by the writer: the same on every rank
  const SaveRole role = SaveRoleOf(engine);
  const uint64_t elements = OwnedShardElements(layout, role);
  if (staging_floats_ < 3 * elements) {
    if (staging_ != nullptr) device_.FreeHost(staging_);
    staging_ = static_cast<float*>(device_.AllocateHost(3 * elements * sizeof(float)));
    staging_floats_ = 3 * elements;
  }
  // Device memory: a DMA into pinned memory, here. Host memory: the writer copies (Loop).
  const bool copy_here = !device_.host_accessible();
  if (copy_here) {
    Status copied = CopyOwnedShard(engine, layout, role, staging_);
    if (!copied.ok()) return copied;  // a local device copy: not expected to differ between ranks
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    staged_ = copy_here;
    job_engine_ = copy_here ? nullptr : &engine;
    job_state_ = state;
    job_layout_ = &layout;
    job_role_ = role;
    job_elements_ = elements;
    has_job_ = true;
  }
  cv_.notify_all();
  stall_ms_ = NowMs() - t0;
  return Status::OK();
}

void AsyncCheckpointer::Loop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_ || has_job_; });
    if (!has_job_) return;  // stop, nothing pending
    has_job_ = false, busy_ = true;
    const TrainState state = job_state_;
    const ParamLayout& layout = *job_layout_;
    const SaveRole role = job_role_;
    const uint64_t n = job_elements_;
    Engine* engine = job_engine_;
    lock.unlock();

    const double t0 = NowMs();
    Status st;
    if (engine != nullptr) {  // the caller runs forward/backward meanwhile: they only read this state
      st = CopyOwnedShard(*engine, layout, role, staging_);
      lock.lock();
      staged_ = true;
      lock.unlock();
      cv_.notify_all();
    }
    const float* staged = staging_;
    const ShardFill fill = [staged, n](int kind, uint64_t at, uint64_t count, float* dst) {
      std::memcpy(dst, staged + kind * n + at, count * sizeof(float));
      return Status::OK();
    };
    // A failed copy is agreed on (and nothing published) by the first agreement inside
    // SaveCheckpointFrom: it is passed on as a fill that fails.
    const ShardFill failing = [st](int, uint64_t, uint64_t, float*) { return st; };
    st = SaveCheckpointFrom(dir_, state, layout, role, st.ok() ? fill : failing, *control_, keep_last_, quiet_);
    const double ms = NowMs() - t0;

    lock.lock();
    result_ = st;
    write_ms_ = ms;
    busy_ = false;
    lock.unlock();
    cv_.notify_all();
  }
}

}  // namespace shardgpt
