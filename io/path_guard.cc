#include "io/path_guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

namespace shardgpt {

namespace {

// The canonical absolute path of `p`: realpath when it exists (symlinks resolved), else the
// realpath of its directory plus its name (the file it would create). "" when neither resolves.
std::string Canonical(const std::string& p) {
  char buf[PATH_MAX];
  if (::realpath(p.c_str(), buf) != nullptr) return buf;
  const size_t slash = p.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
  const std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  if (::realpath(dir.c_str(), buf) == nullptr) return "";
  const std::string d = buf;
  return d == "/" ? "/" + name : d + "/" + name;
}

// Same file: same device and inode when both exist (a hard link, a symlink), else the same
// canonical path.
bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  const std::string ca = Canonical(a), cb = Canonical(b);
  return !ca.empty() && ca == cb;
}

// `p` is `dir` or lies under it (canonical paths, so through symlinks); a hard link to a file
// inside the directory is caught by the device+inode check against the directory's files.
bool Inside(const std::string& p, const std::string& dir) {
  const std::string cp = Canonical(p), cd = Canonical(dir);
  if (cp.empty() || cd.empty()) return false;
  if (cp == cd) return true;
  const std::string prefix = cd == "/" ? "/" : cd + "/";
  return cp.compare(0, prefix.size(), prefix) == 0;
}

// A hard link elsewhere to a file directly in `dir` (a checkpoint's shard files and index sit
// at its top level): the same device and inode as one of its entries.
bool HardLinkInto(const std::string& p, const std::string& dir) {
  struct stat sp {};
  if (::stat(p.c_str(), &sp) != 0 || !S_ISREG(sp.st_mode) || sp.st_nlink < 2) return false;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  for (struct dirent* e; !found && (e = ::readdir(d)) != nullptr;) {
    struct stat se {};
    found = ::fstatat(::dirfd(d), e->d_name, &se, 0) == 0 && se.st_dev == sp.st_dev && se.st_ino == sp.st_ino;
  }
  ::closedir(d);
  return found;
}

std::string Describe(const NamedPath& p) { return p.flag.empty() ? p.path : p.flag + " " + p.path; }

}  // namespace

Status CheckOutputsAgainstInputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& input_files,
                                 const std::vector<NamedPath>& input_dirs) {
  for (size_t i = 0; i < outputs.size(); i++) {
    const NamedPath& out = outputs[i];
    if (out.path.empty()) continue;
    for (const NamedPath& in : input_files)
      if (!in.path.empty() && SameFile(out.path, in.path))
        return Status::InvalidArgument("output " + Describe(out) + " is the input " + Describe(in) + " (" +
                                       Canonical(in.path) + "): refusing to overwrite it; write elsewhere");
    for (const NamedPath& dir : input_dirs)
      if (!dir.path.empty() && (Inside(out.path, dir.path) || HardLinkInto(out.path, dir.path)))
        return Status::InvalidArgument("output " + Describe(out) + " is inside the input " + Describe(dir) + " (" +
                                       Canonical(dir.path) + "): refusing to overwrite it; write elsewhere");
    for (size_t j = 0; j < i; j++)
      if (!outputs[j].path.empty() && SameFile(out.path, outputs[j].path))
        return Status::InvalidArgument("outputs " + Describe(outputs[j]) + " and " + Describe(out) +
                                       " are the same file: give two different paths");
  }
  return Status::OK();
}

void AddModelInput(const std::string& flag, const std::string& path, std::vector<NamedPath>* files,
                   std::vector<NamedPath>* dirs) {
  if (path.empty()) return;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    dirs->push_back({flag, path});
    return;
  }
  files->push_back({flag, path});
  const std::string ext = ".safetensors";
  if (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    const size_t slash = path.rfind('/');
    files->push_back({flag + " (its config.json)", (slash == std::string::npos ? "" : path.substr(0, slash + 1)) + "config.json"});
  }
}

Status CheckDisjointInputs(const std::vector<NamedPath>& a, const std::vector<NamedPath>& b, const std::string& why) {
  for (const NamedPath& y : b)
    for (const NamedPath& x : a)
      if (!x.path.empty() && !y.path.empty() && SameFile(x.path, y.path))
        return Status::InvalidArgument(Describe(y) + " is also a " + x.flag + " file (" + x.path + "): " + why);
  return Status::OK();
}

}  // namespace shardgpt
