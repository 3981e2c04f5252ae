// AsyncCheckpointer: checkpoints written by a background thread while training continues
// (--async-ckpt), as PyTorch DCP's async_save. A save copies this rank's owned state (fp32
// master, m, v: exactly what its shard file holds) into a staging buffer, and a writer thread
// then writes the shard file and, with the other ranks, the index, the rename and `latest`
// (SaveCheckpointFrom, ckpt/checkpoint.h), so the files are those of a synchronous save.
//
// Staging. On a device the host cannot address (CUDA) the caller copies into pinned host
// memory (Device::AllocateHost) inside Save: a DMA at device-to-host bandwidth. On the CPU the
// copy itself is the writer thread's first job, while the caller goes on with the next
// forward and backward, which only read the owned state: the caller must call WaitStaged()
// before anything writes it (the optimizer step), and is blocked only if the copy is slower
// than that forward and backward.
//
// At most one save is in flight: the next Save waits for it first (one staging buffer). The
// index is written, and the checkpoint published, only after every rank's shard file is
// durable (fsynced), agreed on a communicator of the writer's own (Communicator::
// DuplicateControl): the training thread's collectives keep their order and are never matched
// against the writer's. A kill at any moment of the background write leaves the previous
// checkpoint, and `latest`, as they were (the save's temporary directory is removed by the
// next save).
//
// Thread/rank contract: Create, Save, Wait and the destructor are collective over the
// training communicator's ranks and called by the training thread only (the writer thread
// communicates only over its own communicator). A save's error is agreed on by every rank in
// the writer and returned, the same on every rank, by the next Save or Wait.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_index.h"
#include "model/device.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/engine.h"

namespace shardgpt {

class AsyncCheckpointer {
 public:
  // Collective over comm: duplicates it for the writer (an error where that is impossible,
  // e.g. MPI without MPI_THREAD_MULTIPLE). Staging memory is allocated at the first Save.
  static StatusOr<std::unique_ptr<AsyncCheckpointer>> Create(Communicator& comm, Device& device, std::string dir,
                                                             int keep_last, bool quiet);
  ~AsyncCheckpointer();  // waits for the save in flight

  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Waits for the save in flight (returning its error, if any, without starting this one),
  // stages this rank's state and starts writing DIR/step_XXXXXXXX in the background.
  Status Save(const TrainState& state, Engine& engine, const ParamLayout& layout);
  // Waits for the save in flight, if any; its outcome (OK when none was in flight).
  Status Wait();
  // Returns once the last Save's copy of the owned state is complete (at once if it is, or
  // if there is none): call it before the owned state changes. Local. Adds the time blocked
  // to last_stall_ms().
  void WaitStaged();

  // Milliseconds the last Save (or Wait) blocked its caller: waiting for the previous save
  // plus staging the copy. And the duration of the last background write that finished
  // (staging excluded), or -1 if none finished since the last call of TakeWriteMs.
  double last_stall_ms() const { return stall_ms_; }
  double TakeWriteMs();

 private:
  AsyncCheckpointer(std::unique_ptr<Communicator> control, Device& device, std::string dir, int keep_last, bool quiet);
  void Loop();

  std::unique_ptr<Communicator> control_;  // the writer thread's communicator
  Device& device_;
  const std::string dir_;
  const int keep_last_;
  const bool quiet_;
  float* staging_ = nullptr;  // 3 x elements floats, device_.AllocateHost
  uint64_t staging_floats_ = 0;
  double stall_ms_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  // guarded by mu_: the job handed to the writer, and its outcome
  bool has_job_ = false, busy_ = false, stop_ = false;
  bool staged_ = true;         // the last Save's copy is complete
  Engine* job_engine_ = nullptr;  // set when the writer thread makes the copy (host-accessible device)
  TrainState job_state_;
  const ParamLayout* job_layout_ = nullptr;
  SaveRole job_role_;
  uint64_t job_elements_ = 0;
  Status result_;
  double write_ms_ = -1;
  std::thread thread_;  // started last
};

}  // namespace shardgpt
