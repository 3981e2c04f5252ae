// One GPU per rank (see the header): the shared-GPU decision and the gather of (host, bus id).
#include "parallel/gpu_binding.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

namespace shardgpt {

namespace {

// one record: host, bus id, machine id, each NUL-padded
constexpr size_t kHostBytes = 256, kBusBytes = 64, kMachineBytes = 64;

// The first line of a file, without its newline; "" if it cannot be read.
std::string FirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "0 and 3", "0, 1 and 3".
std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); i++) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

std::string SharedGpuError(const std::vector<RankGpu>& ranks) {
  // (machine, bus id) -> ranks, kept in order of each GPU's lowest rank
  std::map<std::pair<std::string, std::string>, size_t> index;
  std::vector<std::vector<int>> users;
  for (size_t r = 0; r < ranks.size(); r++) {
    if (ranks[r].bus_id.empty()) continue;  // unknown: nothing to compare
    auto key = std::make_pair(ranks[r].machine.empty() ? "host " + ranks[r].host : ranks[r].machine, ranks[r].bus_id);
    auto it = index.find(key);
    if (it == index.end()) it = index.emplace(key, users.size()).first, users.emplace_back();
    users[it->second].push_back(static_cast<int>(r));
  }
  const std::vector<int>* first = nullptr;
  size_t shared = 0;
  for (const std::vector<int>& u : users) {
    if (u.size() < 2) continue;
    if (first == nullptr) first = &u;
    shared++;
  }
  if (first == nullptr) return "";
  const RankGpu& g = ranks[first->front()];
  std::string more;
  if (shared > 1)
    more = " (and " + std::to_string(shared - 1) + " more GPU" + (shared > 2 ? "s" : "") + " shared likewise)";
  return "--comm nccl: ranks " + RankList(*first) + " on host " + g.host + " share GPU " + g.bus_id + more +
         "; NCCL needs one GPU per rank (check --gpu-bind / CUDA_VISIBLE_DEVICES, or use --comm mpi to share GPUs)";
}

std::string ThisHostName() {
  char host[kHostBytes] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

std::string ThisMachineId() {
  std::string id = FirstLine("/proc/sys/kernel/random/boot_id");
  if (id.empty()) id = FirstLine("/etc/machine-id");
  return id;
}

StatusOr<std::vector<RankGpu>> GatherRankGpus(Communicator& comm, const RankGpu& mine) {
  const size_t record = kHostBytes + kBusBytes + kMachineBytes;
  std::vector<char> send(record, 0), recv(record * comm.world_size(), 0);
  std::memcpy(send.data(), mine.host.data(), std::min(mine.host.size(), kHostBytes - 1));
  std::memcpy(send.data() + kHostBytes, mine.bus_id.data(), std::min(mine.bus_id.size(), kBusBytes - 1));
  std::memcpy(send.data() + kHostBytes + kBusBytes, mine.machine.data(), std::min(mine.machine.size(), kMachineBytes - 1));
  SHARDGPT_RETURN_IF_ERROR(comm.ControlAllGather(send.data(), recv.data(), record));
  std::vector<RankGpu> all(comm.world_size());
  for (size_t r = 0; r < all.size(); r++) {
    const char* p = recv.data() + r * record;
    all[r].host.assign(p, strnlen(p, kHostBytes));
    all[r].bus_id.assign(p + kHostBytes, strnlen(p + kHostBytes, kBusBytes));
    all[r].machine.assign(p + kHostBytes + kBusBytes, strnlen(p + kHostBytes + kBusBytes, kMachineBytes));
  }
  return all;
}

}  // namespace shardgpt
