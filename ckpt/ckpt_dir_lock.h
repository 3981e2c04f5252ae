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
//
// PidLockFile is the lock itself, for any file a job must hold alone (DIR/.lock of a
// --ckpt-dir, LOG.lock beside a --log file): the same O_EXCL file, contents and staleness rule.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"

namespace shardgpt {

class PidLockFile {
 public:
  // Creates `lock_path` holding "host pid slurm-job-id", taking over a stale one (see above).
  // `what` names the thing locked in the messages ("--ckpt-dir D", "--log F"); a live holder
  // is "<what> is in use by another job (<lock_path>: host H, pid P); <hint>".
  static StatusOr<std::unique_ptr<PidLockFile>> Acquire(const std::string& lock_path, const std::string& what,
                                                       const std::string& hint);
  ~PidLockFile();  // removes the lock file
  PidLockFile(const PidLockFile&) = delete;
  PidLockFile& operator=(const PidLockFile&) = delete;

 private:
  explicit PidLockFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

class CheckpointDirLock {
 public:
  // Creates dir if missing, checks it is writable, takes the lock.
  static StatusOr<std::unique_ptr<CheckpointDirLock>> Acquire(const std::string& dir);
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  explicit CheckpointDirLock(std::unique_ptr<PidLockFile> lock) : lock_(std::move(lock)) {}
  std::unique_ptr<PidLockFile> lock_;
};

}  // namespace shardgpt
