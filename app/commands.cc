#include "app/commands.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "app/auto_micro_batch.h"
#include "io/bpe_tokenizer.h"
#include "ckpt/checkpoint.h"
#include "io/llmc_model.h"
#include "io/path_guard.h"
#include "io/prepare.h"
#include "io/tokenizer.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/sampler.h"
#include "parallel/memory_model.h"
#include "parallel/muon_plan.h"
#include "parallel/nccl_memory.h"

namespace shardgpt {

Status RunPrepare(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                  const std::string& text_field) {
  {  // the shards it writes may not replace a text it reads
    std::vector<NamedPath> in;
    for (const std::string& f : inputs) in.push_back({"--input", f});
    SHARDGPT_RETURN_IF_ERROR(CheckOutputsAgainstInputs(
        {{"--output", out_dir + "/train.bin"}, {"--output", out_dir + "/val.bin"}}, in, {}));
  }
  PrepareStats stats;
  SHARDGPT_RETURN_IF_ERROR(PrepareByteLevel(inputs, out_dir, val_fraction, &stats, text_field));
  std::printf("prepared %llu byte-level tokens: %s (%llu), %s (%llu)\n",
              static_cast<unsigned long long>(stats.total_tokens), stats.train_path.c_str(),
              static_cast<unsigned long long>(stats.train_tokens), stats.val_path.c_str(),
              static_cast<unsigned long long>(stats.val_tokens));
  return Status::OK();
}

Status RunSample(const SampleOptions& o, int threads) {
  // A negative -n, temperature or --top-k is refused. -n 0 prints the prompt decoded and generates nothing
  // (a tokenizer's decode(encode(x)) round trip; tests/e2e/hf_tokenizer.sh uses it).
  if (o.tokens < 0)
    return Status::InvalidArgument("sample -n/--tokens " + std::to_string(o.tokens) +
                                   ": expected >= 0 tokens to generate (0: print the prompt only)");
  if (!(o.temperature >= 0))
    return Status::InvalidArgument("sample --temperature " + std::to_string(o.temperature) + ": expected >= 0 (0: greedy)");
  if (o.top_k < 0) return Status::InvalidArgument("sample --top-k " + std::to_string(o.top_k) + ": expected >= 0 (0: all tokens)");
  SetComputeThreads(threads);
  if (o.model_file.empty() == o.checkpoint.empty())
    return Status::InvalidArgument("sample: give exactly one of --model-file FILE or --checkpoint DIR");
  auto m = o.checkpoint.empty() ? ReadLlmcModel(o.model_file) : LoadCheckpointFullModel(o.checkpoint);
  if (!m.ok()) return m.status();
  const GPTConfig cfg = m->config;
  Tokenizer tok = Tokenizer::ByteLevel();
  std::shared_ptr<const BpeTokenizer> bpe;  // a tokenizer.json decodes and encodes --prompt
  if (o.tokenizer_file.size() > 5 && o.tokenizer_file.compare(o.tokenizer_file.size() - 5, 5, ".json") == 0) {
    auto t = BpeTokenizer::Load(o.tokenizer_file);
    if (!t.ok()) return t.status();
    bpe = t.value();
    tok = bpe->DecodeTable();
  } else if (!o.tokenizer_file.empty()) {
    auto t = LoadLlmcTokenizer(o.tokenizer_file);
    if (!t.ok()) return t.status();
    tok = std::move(t.value());
  }
  std::vector<int32_t> ctx;
  if (!o.prompt_ids.empty()) {
    for (int id : o.prompt_ids) {
      if (id < 0 || id >= cfg.vocab_size)
        return Status::InvalidArgument("--prompt-ids: token " + std::to_string(id) + " outside the model's vocabulary [0, " +
                                       std::to_string(cfg.vocab_size) + ")");
      ctx.push_back(id);
    }
  } else if (bpe) {
    if (bpe->vocab_size() > cfg.vocab_size)
      return Status::InvalidArgument(o.tokenizer_file + ": " + std::to_string(bpe->vocab_size()) +
                                     " ids, more than the model's vocabulary of " + std::to_string(cfg.vocab_size));
    std::vector<int32_t> ids;
    BpeTokenizer::Session session(*bpe);
    SHARDGPT_RETURN_IF_ERROR(session.Encode("--prompt", o.prompt.data(), o.prompt.size(), 0, &ids));
    ctx.insert(ctx.end(), ids.begin(), ids.end());
  } else {
    if (cfg.vocab_size < 256 || !o.tokenizer_file.empty())
      return Status::InvalidArgument("--prompt: text prompts need a byte-level model (vocab >= 256, no --tokenizer); "
                                     "use --prompt-ids");
    for (uint16_t b : ByteLevelTokenizer::Encode(o.prompt)) ctx.push_back(b);
  }
  if (ctx.empty()) ctx.push_back(tok.eot_token() >= 0 ? tok.eot_token() : 0);
  ParamLayout layout(cfg);
  LocalParams local(layout);
  std::copy(m->params.begin(), m->params.end(), local.params());
  GPT model(cfg, 1, cfg.max_seq_len);
  Rng rng(o.seed, 11);
  for (int32_t id : ctx) std::fputs(tok.Decode(id).c_str(), stdout);
  SamplingOptions so{o.tokens, o.temperature, o.top_k};
  Generate(model, local, ctx, so, rng, [&](int id) {
    std::fputs(tok.Decode(id).c_str(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  return Status::OK();
}

StatusOr<double> ParseMemorySize(const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  const std::string unit = end ? std::string(end) : "";
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},         {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},   {"GB", 1e9},        {"TB", 1e12}};
  const bool number = end != s && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.') &&
                      text.find_first_of("xXpP") == std::string::npos;  // no hex floats
  for (const auto& u : kUnits)
    if (number && unit == u.first && std::isfinite(v) && v > 0) return v * u.second;
  return Status::InvalidArgument("--memory " + text +
                                 ": expected a positive size such as 80GiB, 512MiB or 4096 (units B, KiB, MiB, GiB, "
                                 "TiB, KB, MB, GB, TB)");
}

namespace {

// --memory: for each ZeRO stage x recompute mode, the largest micro-batch whose predicted peak
// fits, its peak, and the step's traffic (which no micro-batch or recompute mode changes).
void PrintWhatFits(const PlanOptions& o, const ParamLayout& layout, const ShardPlan& plan_all,
                   const ShardPlan& plan_group, double nccl_bytes) {
  // GiB, or MiB for a budget below one GiB
  const bool mib = o.memory_bytes < 1024.0 * 1024 * 1024;
  const double GiB = mib ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
  const char* U = mib ? "MiB" : "GiB";
  std::printf("what fits in %.3f %s per rank at T=%d, grad-accum %d: the largest micro-batch (sequences per rank) "
              "by the peak predictor\n",
              o.memory_bytes / GiB, U, o.seq_len, o.grad_accum);
  const double budget = o.memory_bytes - nccl_bytes;
  if (nccl_bytes > 0)
    std::printf("(less NCCL's own buffers, %.3f %s estimated: %.3f %s for the peak)\n", nccl_bytes / GiB, U,
                budget / GiB, U);
  const std::string peak_h = std::string("peak ") + U, act_h = std::string("activations ") + U,
                    left_h = std::string("left ") + U;
  std::printf("%-6s %-9s %11s %13s %15s %13s %13s %14s\n", "stage", "recompute", "micro-batch", peak_h.c_str(),
              act_h.c_str(), left_h.c_str(), "traffic/step", "recompute cost");
  for (int stage = 0; stage <= 3; stage++) {
    EngineOptions e = o.engine;
    e.zero_stage = stage;
    if (stage < 2) e.reduce_every_micro = true;
    const ShardPlan& plan = stage == 0 ? plan_all : plan_group;
    const double traffic = ExpectedStepTraffic(layout, plan, e, o.grad_accum).Total().bytes_sent;
    for (Recompute r : {Recompute::kNone, Recompute::kGelu, Recompute::kBlock}) {
      const int b = budget > 0 ? LargestFittingMicroBatch(layout, plan, e, o.seq_len, o.grad_accum, r, budget) : 0;
      const double cost = GPT::RecomputeFlops(o.model, 1, o.seq_len, r) / (3 * GPT::ForwardFlops(o.model, 1, o.seq_len));
      if (b == 0) {
        const double need = PredictPeakMemory(layout, plan, e, 1, o.seq_len, o.grad_accum, r).peak();
        std::printf("%-6d %-9s %11s %13.3f %15s %13s %9.3f %s %13.2f%%  (B=1 needs this peak)\n", stage,
                    RecomputeName(r), "none fits", need / GiB, "-", "-", traffic / GiB, U, 100 * cost);
        continue;
      }
      const MemoryPrediction m = PredictPeakMemory(layout, plan, e, b, o.seq_len, o.grad_accum, r);
      std::printf("%-6d %-9s %11d %13.3f %15.3f %13.3f %9.3f %s %13.2f%%\n", stage, RecomputeName(r), b, m.peak() / GiB,
                  m.activations / GiB, (budget - m.peak()) / GiB, traffic / GiB, U, 100 * cost);
    }
  }
  std::printf("(peak: per rank, parallel/memory_model.h; traffic: bytes sent per rank per step, ring model; "
              "recompute cost: the re-computed forward FLOPs as a share of the step's 3x forward, model/gpt.h)\n");
  std::printf("(train --micro-batch auto --memory takes the same micro-batch, or fewer where a bound below wins, and "
              "says which: at most the data's windows per rank, and on the CPU at most %d tokens per micro-batch "
              "(the throughput cap); without --memory the budget is the tightest of the device's free memory, "
              "MemAvailable, the cgroup limit and ulimit -v, less %.0f%% headroom and %.0f MiB of overheads, "
              "app/auto_micro_batch.h)\n",
              kCpuAutoTokens, 100 * kAutoHeadroomFrac, kAutoOverheadBytes / 1048576.0);
}

}  // namespace

Status RunPlan(const PlanOptions& o) {
  SHARDGPT_RETURN_IF_ERROR(o.engine.Validate());
  if (o.ranks < 1) return Status::InvalidArgument("--ranks must be >= 1");
  const std::string comm = o.comm == "auto" ? (o.device == "cuda" ? "nccl" : "mpi") : o.comm;
  if (comm == "nccl" && o.device != "cuda")
    return Status::InvalidArgument("plan --comm nccl needs --device cuda (NCCL moves GPU memory)");
  if (o.ranks_per_node < 0) return Status::InvalidArgument("--ranks-per-node must be >= 1");
  // HSDP: stages 1-3 shard over G ranks and replicate across R = N/G groups; stage 0 over all N.
  EngineOptions sharded = o.engine;
  if (sharded.zero_stage == 0) sharded.zero_stage = 1;  // G is checked as a sharding stage would use it
  auto group = sharded.ShardGroupSize(o.ranks);
  if (!group.ok()) return group.status();
  const int G = group.value(), R = o.ranks / G;
  ParamLayout layout(o.model);
  ShardPlan plan_all(layout, o.ranks, o.engine.shard_layout), plan_group(layout, G, o.engine.shard_layout);
  auto plan_for = [&](int stage) -> const ShardPlan& { return stage == 0 ? plan_all : plan_group; };
  const double psi = static_cast<double>(layout.total_numel());
  const double act = static_cast<double>(GPT::ActivationBytes(o.model, o.micro_batch, o.seq_len, o.recompute, o.engine.act_dtype));
  // GiB, or MiB when every figure is below one GiB ("G" / "M" after each figure)
  double largest = 0;
  for (int stage = 0; stage <= 3; stage++) {
    EngineOptions e = o.engine;
    e.zero_stage = stage;
    largest = std::max(largest, PredictPeakMemory(layout, plan_for(stage), e, o.micro_batch, o.seq_len, o.grad_accum, o.recompute).peak());
  }
  // NCCL's own buffers: not a tracked allocation, a row of its own (--device cuda --comm nccl)
  const bool nccl = comm == "nccl";
  const int per_node = std::min(o.ranks, o.ranks_per_node > 0 ? o.ranks_per_node : 8);
  const NcclMemoryAssumptions nccl_a =
      NcclAssumptionsFromEnvironment([](const char* name) -> const char* { return std::getenv(name); }, o.nvls);
  const NcclMemoryEstimate nccl_e = EstimateNcclMemory(o.ranks, G, per_node, nccl_a);
  const double nccl_bytes = nccl ? nccl_e.total() : 0;
  const bool mib = largest < 1024.0 * 1024 * 1024;
  const double GiB = mib ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
  const char* U = mib ? "M" : "G";
  std::printf("model %s: %.1fM parameters; %d ranks, micro-batch %d x %d tokens, grad-accum %d, %s (reduce %s)\n",
              o.model.ToString().c_str(), psi / 1e6, o.ranks, o.micro_batch, o.seq_len, o.grad_accum,
              DTypeName(o.engine.dtype), DTypeName(o.engine.reduce_dtype));
  if (R > 1)
    std::printf("HSDP: stages 1-3 shard within %d group(s) of G=%d ranks and replicate across them (memory formulas "
                "with G for N); stage 0 all-reduces over all %d\n", R, G, o.ranks);
  std::printf("activations (%s, --recompute %s, attention O(T)): %.3f %siB per rank\n", DTypeName(o.engine.act_dtype),
              RecomputeName(o.recompute), act / GiB, U);
  double psi_muon = 0;
  if (o.engine.optimizer == OptimizerKind::kMuon) {
    const MuonPlan mp(layout, plan_group, false, o.engine.muon.ns_steps);
    psi_muon = static_cast<double>(mp.muon_numel());
    double most = 0, all = 0;
    for (int r = 0; r < plan_group.world_size(); r++) most = std::max(most, mp.OwnerFlops(r)), all += mp.OwnerFlops(r);
    std::printf("optimizer muon: %zu matrices, %.1fM elements (%.1f%% of Psi) with k-4 bytes of state each (no second "
                "moment); Newton-Schulz %.3f GFLOP per step in all, %.3f GFLOP on the busiest of %d owner rank(s)\n",
                mp.matrices().size(), psi_muon / 1e6, 100 * psi_muon / psi, all / 1e9, most / 1e9,
                plan_group.world_size());
  }
  std::printf("%-6s %11s %11s %11s %11s %12s %13s %13s%s%s\n", "stage", "params", "grads", "optimizer", "states",
              "formula", "peak", "traffic/step", R > 1 ? " across/step" : "", o.mem_gib > 0 ? "  fits?" : "");
  MemoryPrediction chosen;
  for (int stage = 0; stage <= 3; stage++) {
    EngineOptions e = o.engine;
    e.zero_stage = stage;
    if (stage < 2) e.reduce_every_micro = true;
    const ShardPlan& plan = plan_for(stage);
    const int n = plan.world_size(), groups = stage == 0 ? 1 : R;
    const StateSizes s = PersistentStateSizes(plan, e, &layout, 0);
    const CommLedger traffic = ExpectedStepTraffic(layout, plan, e, o.grad_accum);
    const CommLedger across = ExpectedCrossGroupTraffic(plan, e, groups);
    const MemoryPrediction m = PredictPeakMemory(layout, plan, e, o.micro_batch, o.seq_len, o.grad_accum, o.recompute);
    if (stage == o.engine.zero_stage) chosen = m;
    std::printf("%s%-5d %9.3f %s %9.3f %s %9.3f %s %9.3f %s %10.3f %s %11.3f %s %11.3f %s",
                stage == o.engine.zero_stage ? "*" : " ", stage, s.params / GiB, U, s.grads / GiB, U, s.optimizer / GiB,
                U, s.total() / GiB, U, Formula::ModelStateBytes(psi, n, e, psi_muon) / GiB, U, m.peak() / GiB, U,
                traffic.Total().bytes_sent / GiB, U);
    if (R > 1 && stage == 0) std::printf(" %11s", "(all ranks)");  // DDP: one all-reduce over N
    else if (R > 1) std::printf(" %9.3f %s", across.Total().bytes_sent / GiB, U);
    std::printf("%s\n", o.mem_gib <= 0 ? "" : m.peak() + nccl_bytes <= o.mem_gib * 1024.0 * 1024 * 1024 ? "  yes" : "  no");
  }
  if (nccl)  // the same for every stage: the communicators do not depend on it
    std::printf("%-6s %11s %11s %11s %11s %12s %11.3f %s\n", "+nccl", "-", "-", "-", "-", "-", nccl_bytes / GiB, U);
  if (psi_muon > 0)
    std::printf("(muon: traffic includes the all_to_all of U pieces to the matrix owners and of updates back, on rank "
                "0, exact from the plan; optimizer = rank 0's allocation)\n");
  std::printf("(* = --zero-stage; bytes per rank; 'formula' is the seed's 2/2/k Psi split for this precision; "
              "traffic counts bytes sent per rank, ring model)\n");
  std::printf("(peak: the largest total of tracked device allocations in a step = states + optimizer workspace + "
              "activations + transient buffers, replayed in the engine's order, parallel/memory_model.h)\n");
  if (nccl)
    std::printf("(+nccl: NCCL's own device buffers per rank, add to each peak%s; an ESTIMATE, not tracked: %s; "
                "%d rank(s) per node; NCCL connects lazily and picks channels by topology, so a run may use less; "
                "parallel/nccl_memory.h)\n",
                o.mem_gib > 0 ? ", included in fits?" : "", nccl_e.Describe(nccl_a).c_str(), per_node);
  if (R > 1)
    std::printf("(traffic/step: inside a group, 4Psi(G-1)/G or 6Psi(G-1)/G at stage 3 (bytes per element: the "
                "dtypes); across/step: across groups, 2 x (rPsi/G) x (R-1)/R, r = reduce dtype bytes: the only "
                "bytes on the inter-node links)\n");
  {
    EngineOptions e = o.engine;
    e.zero_stage = 0;
    const auto buckets = PlanBuckets(plan_all, e);
    double first = 0;
    for (int u : buckets.front()) first += plan_all.unit(u).padded * DTypeSize(e.reduce_dtype);
    std::printf("stage 0: %zu gradient buckets of whole units (--bucket-mb %g); the first holds %.2f MiB (whole units "
                "in backward order until 1 MiB)\n",
                buckets.size(), e.bucket_mb, first / 1048576.0);
  }
  std::printf("stage %d peak %.3f %s at %s: states %.3f + optimizer workspace %.3f + activations %.3f + "
              "gathered units and fp32 compute copies %.3f + fp32 gradient scratch %.3f + communication "
              "buffers %.3f\n",
              o.engine.zero_stage, chosen.peak() / GiB, U, chosen.where.c_str(),
              (chosen.params + chosen.grads + chosen.optimizer) / GiB, chosen.workspace / GiB, chosen.activations / GiB,
              chosen.gathered / GiB, chosen.grad_scratch / GiB, chosen.comm / GiB);
  // What each shard layout pads: every full buffer (stages 0-2 parameters, full gradients,
  // gathered units) and every collective carries it; each shard carries 1/N of it.
  std::printf("shard layout padding (elements added per full copy of the model, sharded over %d ranks):\n", G);
  for (ShardLayout sl : {ShardLayout::kFlat, ShardLayout::kPerParam}) {
    const ShardPlan p(layout, G, sl);
    std::printf("%s %-10s %12zu elements = %8.4f%% of Psi (%.3f MiB per %s copy)\n",
                sl == o.engine.shard_layout ? "*" : " ", ShardLayoutName(sl), p.total_padding(),
                100.0 * p.total_padding() / psi, p.total_padding() * DTypeSize(o.engine.dtype) / 1048576.0,
                DTypeName(o.engine.dtype));
  }
  std::printf("(* = --shard-layout; flat pads each unit to a multiple of N, per-param each tensor's rows)\n");
  if (o.memory_bytes > 0) PrintWhatFits(o, layout, plan_all, plan_group, nccl_bytes);
  return Status::OK();
}

}  // namespace shardgpt
