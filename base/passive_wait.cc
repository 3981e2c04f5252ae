#include "base/passive_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace shardgpt {

void EnsurePassiveOpenMPWait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;  // the user chose
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

}  // namespace shardgpt
