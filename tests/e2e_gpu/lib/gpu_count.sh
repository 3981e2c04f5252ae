# Sourced by tests/e2e_gpu/*.sh: how many ranks can each have a GPU of their own.
# GPU_COUNT: the GPUs nvidia-smi lists; where there is no nvidia-smi (the CUDA emulation, whose
# every rank has its own emulated GPU) as many as any test asks for.
# gpu_comm NP: the --comm for NP ranks: nccl where each rank can have its own GPU (NCCL needs one
# per rank), else mpi (ranks sharing a GPU), so that a one-GPU machine still runs every case.
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU_COUNT=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
else
  GPU_COUNT=1024
fi
gpu_comm() { if [ "$1" -le "$GPU_COUNT" ]; then echo nccl; else echo mpi; fi; }
