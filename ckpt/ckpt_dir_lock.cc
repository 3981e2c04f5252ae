#include "ckpt/ckpt_dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace shardgpt {

namespace fs = std::filesystem;

namespace {
// The Slurm job this process belongs to ("-" outside Slurm): a requeued job keeps its id.
std::string JobId() {
  const char* id = std::getenv("SLURM_JOB_ID");
  return id && *id ? id : "-";
}

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}
// Whether pid is a live process (a zombie, killed but not yet reaped, is not).
bool Alive(long long pid) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t paren = line.rfind(')');
  return !(paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z');
}
}  // namespace

StatusOr<std::unique_ptr<PidLockFile>> PidLockFile::Acquire(const std::string& path, const std::string& what,
                                                           const std::string& hint) {
  const std::string me = HostName() + " " + std::to_string(getpid()) + " " + JobId();
  for (int attempt = 0; attempt < 2; attempt++) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const std::string line = me + "\n";
      const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
      const std::string err = ok ? "" : std::strerror(errno);
      close(fd);
      if (!ok) {
        unlink(path.c_str());
        return Status::IOError(what + ": cannot write " + path + ": " + err);
      }
      return std::unique_ptr<PidLockFile>(new PidLockFile(path));
    }
    if (errno != EEXIST) return Status::IOError(what + ": cannot create " + path + ": " + std::strerror(errno));
    std::ifstream in(path);
    std::string host, job;
    long long pid = -1;
    in >> host >> pid >> job;
    const bool dead_here = host == HostName() && pid > 0 && !Alive(pid);
    const bool same_job = JobId() != "-" && job == JobId();  // this job's earlier run, before a requeue
    const bool stale = dead_here || same_job;
    if (!stale)
      return Status::InvalidArgument(what + " is in use by another job (" + path + ": host " +
                                     (host.empty() ? "?" : host) + ", pid " + std::to_string(pid) + "); " + hint);
    unlink(path.c_str());  // a dead process's lock on this host: take it over
  }
  return Status::IOError(what + ": cannot take " + path);
}

PidLockFile::~PidLockFile() { unlink(path_.c_str()); }

StatusOr<std::unique_ptr<CheckpointDirLock>> CheckpointDirLock::Acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec))
    return Status::IOError("--ckpt-dir " + dir + ": cannot create the checkpoint directory" +
                           (ec ? " (" + ec.message() + ")" : ""));
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::IOError("--ckpt-dir " + dir + ": not writable (" + std::strerror(errno) + ")");
  auto lock = PidLockFile::Acquire(dir + "/.lock", "--ckpt-dir " + dir,
                                   "use another directory, or delete the lock if that job is gone");
  if (!lock.ok()) return lock.status();
  return std::unique_ptr<CheckpointDirLock>(new CheckpointDirLock(std::move(lock.value())));
}

}  // namespace shardgpt
