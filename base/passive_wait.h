// Makes OpenMP worker threads sleep, not spin, between parallel regions.
//
// Our element-wise kernels (OpenMP) alternate with sgemm (OpenBLAS's own thread pool) many
// times per step. With libgomp's default wait policy, idle OpenMP workers spin on the core
// that OpenBLAS needs next, which slows training several-fold on a machine with few cores.
// libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main(): so when the variable
// is unset we set it and re-execute ourselves, once.
#pragma once

namespace shardgpt {

// Call first thing in main(). Returns only if no re-exec was needed (or it failed).
void EnsurePassiveOpenMPWait(char** argv);

}  // namespace shardgpt
