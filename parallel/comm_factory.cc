#include "parallel/comm_factory.h"

#include <unistd.h>

#include "parallel/mpi_communicator.h"
#ifdef SHARDGPT_HAVE_NCCL
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace shardgpt {

bool NcclBuilt() {
#ifdef SHARDGPT_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::string ResolveCommKind(const std::string& kind, const Device& device) {
  if (kind != "auto") return kind;
  return device.is_cuda() && NcclBuilt() ? "nccl" : "mpi";
}

StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommOptions& o, MPI_Comm comm, Device& device) {
  const std::string kind = ResolveCommKind(o.kind, device);
  if (!(o.timeout_s > 0)) return Status::InvalidArgument("--comm-timeout must be > 0 seconds");
  if (kind == "mpi") {
    auto c = MpiCommunicator::Create(comm, &device);
    if (!c.ok()) return c.status();
    c.value()->SetEndJobOnFailure(o.end_job_on_failure);
    c.value()->SetTimeout(o.timeout_s);  // the watchdog, as NCCL's
    return std::unique_ptr<Communicator>(std::move(c.value()));
  }
  if (kind != "nccl") return Status::InvalidArgument("--comm " + kind + ": expected auto, mpi or nccl");
  if (!device.is_cuda()) return Status::InvalidArgument("--comm nccl needs --device cuda (NCCL moves GPU memory)");
#ifdef SHARDGPT_HAVE_NCCL
  NcclOptions no;
  no.timeout_s = o.timeout_s;
  return CreateNcclCommunicator(comm, device, no);
#else
  return Status::Unimplemented("--comm nccl: this shardgpt was built without NCCL (use --comm mpi)");
#endif
}

std::string TopologyLine(const Device& device, int local_rank, int local_size, const std::string& comm_kind) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::string line = std::string("host ") + host + ", local rank " + std::to_string(local_rank) + "/" +
                     std::to_string(local_size) + ", " + device.name() + ", comm " + comm_kind;
#ifdef SHARDGPT_HAVE_NCCL
  if (comm_kind == "nccl") line += " (" + NcclVersionString() + ")";
#endif
  return line;
}

}  // namespace shardgpt
