// CheckpointDirLock: one training job per --ckpt-dir, and a directory that is writable, both
// found at start instead of at the first save hours later.
//
// The lock is the file DIR/.lock, created with O_EXCL and holding "host pid slurm-job-id". A
// lock left by a dead process on this host (no such pid, or a zombie), or by an earlier run
// of this same Slurm job (a requeue, possibly on another node), is stale and taken over; a live
// holder, or one on another host (whose liveness cannot be checked from here), is refused with
// an error naming the directory and the holder. The destructor removes the lock.
//
// Rank contract: only rank 0 acquires it (the directory is shared storage); the caller agrees
// on the result over ranks. Not copyable.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"

namespace shardgpt {

class CheckpointDirLock {
 public:
  // Creates dir if missing, checks it is writable, takes the lock.
  static StatusOr<std::unique_ptr<CheckpointDirLock>> Acquire(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  explicit CheckpointDirLock(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace shardgpt
