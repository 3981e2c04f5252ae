#include "app/launcher.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "app/report.h"
#include "model/device_factory.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {

namespace {

// Rank 0 prints every rank's topology line, in rank order (gathered over the control plane).
void PrintTopology(Communicator& comm, const std::string& mine) {
  constexpr size_t kLine = 512;
  std::vector<char> all(kLine * comm.world_size(), '\0'), own(kLine, '\0');
  std::copy_n(mine.begin(), std::min(mine.size(), kLine - 1), own.begin());
  if (!comm.ControlAllGather(own.data(), all.data(), kLine).ok() || comm.rank() != 0) return;
  for (int r = 0; r < comm.world_size(); r++) std::printf("rank %d: %s\n", r, &all[r * kLine]);
}

}  // namespace

// Open MPI 4.1 started by srun --mpi=pmix: MPI_Init waits in two PMIx fences, the modex (the
// peers' addresses) and a closing barrier, and ob1 registers its receive handlers only between
// them. A rank still waiting in the modex fence runs the TCP BTL's progress; a fragment that a
// peer already out of MPI_Init sent it (its first collective) then goes to the unregistered
// handler: a call through a null pointer (SIGSEGV at address 0 in MPI_Init). With the direct
// modex (async modex, no data collection) MPI_Init has no modex fence: each rank fetches a
// peer's address when it first needs it, and its only fence comes after ob1 registered, so no
// fragment can be progressed before its handler exists. A value the user set is kept.
void PrepareMpiEnvironment() {
  const bool srun_pmix = std::getenv("SLURM_STEP_ID") != nullptr && std::getenv("PMIX_NAMESPACE") != nullptr &&
                         std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr;  // mpirun's ranks have the last
  if (!srun_pmix) return;
  setenv("OMPI_MCA_pmix_base_async_modex", "1", /*overwrite=*/0);
  setenv("OMPI_MCA_pmix_base_collect_data", "0", /*overwrite=*/0);
}

std::string DeviceFlagBeforeParse(int argc, char** argv) {
  std::string value;
  for (int i = 1; i < argc && argv[i] != nullptr; i++) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--device" && i + 1 < argc && argv[i + 1] != nullptr) value = argv[++i];
    else if (a.rfind("--device=", 0) == 0) value = a.substr(9);
  }
  return value;
}

Launcher::Launcher(int* argc, char*** argv) {
  PrepareMpiEnvironment();
  if (DeviceFlagBeforeParse(*argc, *argv) == "cuda")
    early_gpu_ = SetGpuBeforeMpi([](const char* name) -> const char* { return std::getenv(name); });
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  // the node's ranks: MPI's shared-memory split, which is what Open MPI and Slurm use to place them
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

Launcher::~Launcher() { MPI_Finalize(); }

int Launcher::default_threads() const {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_size_);
}

StatusOr<int> Launcher::AutoShardGroupSize() const {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int first = rank_;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, local);
  MPI_Comm_free(&local);
  int v[3] = {local_size_, -local_size_, (first == rank_ - local_rank_ && first % local_size_ == 0) ? 1 : 0};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &v[2], 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (v[0] != -v[1])
    return Status::InvalidArgument("--shard-group-size auto: the nodes run different numbers of ranks (" +
                                   std::to_string(v[0]) + " to " + std::to_string(-v[1]) +
                                   "); start as many on each node or give --shard-group-size G");
  if (!v[2])
    return Status::InvalidArgument("--shard-group-size auto: the ranks of a node are not consecutive (map ranks by "
                                   "slot/node, e.g. mpirun --map-by slot) or give --shard-group-size G");
  return local_size_;
}

Status Launcher::RunOnDevice(const DeviceChoice& choice, const std::function<Status(Communicator&, Device&)>& body) {
  // The device first: the communicator must know where the buffers it moves live.
  Status st = CheckAttentionChoice(choice.attention, choice.device);
  auto dev = st.ok() ? CreateDevice(choice.device, local_rank_, local_size_) : StatusOr<std::unique_ptr<Device>>(st);
  if (!dev.ok()) st = dev.status();
  else st = ApplyAttentionChoice(choice.attention, *dev.value());
  int all_ok = st.ok() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  std::unique_ptr<Communicator> comm;
  const std::string comm_kind = dev.ok() ? ResolveCommKind(choice.comm.kind, *dev.value()) : "mpi";
  if (all_ok) {
    auto c = CreateCommunicator(choice.comm, MPI_COMM_WORLD, *dev.value(), local_size_, VisibleGpuCount());
    if (c.ok()) comm = std::move(c.value());
    else st = c.status();
  }
  if (!comm) {  // agree on the error over a plain host communicator: one line, every rank exits
    auto host = MpiCommunicator::Create(MPI_COMM_WORLD);
    return host.ok() ? Agree(*host.value(), st) : host.status();
  }
  std::string early;  // how the GPU set before MPI_Init relates to the device
  if (early_gpu_.ordinal >= 0 && dev.value()->is_cuda()) {
    const int now = GpuOrdinalOf(*dev.value());
    const std::string from = early_gpu_.from.variable + "=" + std::to_string(early_gpu_.from.rank);
    if (now == early_gpu_.ordinal) {
      early = ", set before MPI_Init from " + from;
    } else {
      std::fprintf(stderr,
                   "shardgpt: warning: rank %d: GPU cuda:%d was set before MPI_Init from %s, but MPI's node-local "
                   "rank %d of %d takes cuda:%d; training on cuda:%d (a CUDA-aware MPI may also hold a context on "
                   "cuda:%d): the launcher's local rank is not MPI's\n",
                   rank_, early_gpu_.ordinal, from.c_str(), local_rank_, local_size_, now, now, early_gpu_.ordinal);
      std::fflush(stderr);
      early = ", not cuda:" + std::to_string(early_gpu_.ordinal) + " set before MPI_Init from " + from;
    }
  }
  if (dev.value()->is_cuda() && !choice.quiet)
    PrintTopology(*comm, TopologyLine(*dev.value(), local_rank_, local_size_, comm_kind) + early);
  try {
    st = body(*comm, *dev.value());
  } catch (const DeviceOutOfMemory& e) {
    // Mid-step: the other ranks wait inside a collective and cannot agree; end them all.
    std::fprintf(stderr, "shardgpt: error: rank %d: %s\n", rank_, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::bad_alloc&) {  // any other host allocation: one line, not an abort trace
    std::fprintf(stderr,
                 "shardgpt: error: rank %d: out of host memory (std::bad_alloc); try a higher --zero-stage, a "
                 "smaller --micro-batch or fewer ranks per node\n",
                 rank_);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return Agree(*comm, st);
}

}  // namespace shardgpt
