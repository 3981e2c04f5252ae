#include "app/commands.h"

#include <cstdio>

#include "io/checkpoint.h"
#include "io/llmc_model.h"
#include "io/prepare.h"
#include "io/tokenizer.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/sampler.h"

namespace shardgpt {

Status RunPrepare(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction) {
  PrepareStats stats;
  SHARDGPT_RETURN_IF_ERROR(PrepareByteLevel(inputs, out_dir, val_fraction, &stats));
  std::printf("prepared %llu byte-level tokens: %s (%llu), %s (%llu)\n",
              static_cast<unsigned long long>(stats.total_tokens), stats.train_path.c_str(),
              static_cast<unsigned long long>(stats.train_tokens), stats.val_path.c_str(),
              static_cast<unsigned long long>(stats.val_tokens));
  return Status::OK();
}

Status RunSample(const SampleOptions& o, int threads) {
  SetComputeThreads(threads);
  if (o.model_file.empty() == o.checkpoint.empty())
    return Status::InvalidArgument("sample: give exactly one of --model-file FILE or --checkpoint DIR");
  auto m = o.checkpoint.empty() ? ReadLlmcModel(o.model_file) : LoadCheckpointFullModel(o.checkpoint);
  if (!m.ok()) return m.status();
  const GPTConfig cfg = m->config;
  Tokenizer tok = Tokenizer::ByteLevel();
  if (!o.tokenizer_file.empty()) {
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

Status RunPlan(const PlanOptions& o) {
  SHARDGPT_RETURN_IF_ERROR(o.engine.Validate());
  if (o.ranks < 1) return Status::InvalidArgument("--ranks must be >= 1");
  ParamLayout layout(o.model);
  ShardPlan plan(layout, o.ranks, o.engine.shard_layout);
  const double psi = static_cast<double>(layout.total_numel()), GiB = 1024.0 * 1024 * 1024;
  const double act = static_cast<double>(GPT::ActivationBytes(o.model, o.micro_batch, o.seq_len));
  std::printf("model %s: %.1fM parameters; %d ranks, micro-batch %d x %d tokens, grad-accum %d, %s (reduce %s)\n",
              o.model.ToString().c_str(), psi / 1e6, o.ranks, o.micro_batch, o.seq_len, o.grad_accum,
              DTypeName(o.engine.dtype), DTypeName(o.engine.reduce_dtype));
  std::printf("activations (fp32, all layers saved, attention O(T)): %.3f GiB per rank\n", act / GiB);
  std::printf("%-6s %11s %11s %11s %11s %12s %13s %13s%s\n", "stage", "params", "grads", "optimizer", "states",
              "formula", "+activations", "traffic/step", o.mem_gib > 0 ? "  fits?" : "");
  for (int stage = 0; stage <= 3; stage++) {
    EngineOptions e = o.engine;
    e.zero_stage = stage;
    if (stage < 2) e.reduce_every_micro = true;
    const StateSizes s = PersistentStateSizes(plan, e);
    const CommLedger traffic = ExpectedStepTraffic(layout, plan, e, o.grad_accum);
    // stage 3 also holds the gathered parameters of the running and the prefetched unit
    double gathered = 0;
    if (stage == 3)
      for (int u = 0; u < plan.num_units(); u++) gathered = std::max(gathered, 2.0 * plan.unit(u).padded * DTypeSize(e.dtype));
    const double need = s.total() + act + gathered;
    std::printf("%s%-5d %9.3f G %9.3f G %9.3f G %9.3f G %10.3f G %11.3f G %11.3f G%s\n",
                stage == o.engine.zero_stage ? "*" : " ", stage, s.params / GiB, s.grads / GiB, s.optimizer / GiB,
                s.total() / GiB, Formula::ModelStateBytes(psi, o.ranks, e) / GiB, need / GiB,
                traffic.Total().bytes_sent / GiB,
                o.mem_gib <= 0 ? "" : need <= o.mem_gib * GiB ? "  yes" : "  no");
  }
  std::printf("(* = --zero-stage; bytes per rank; 'formula' is the seed's 2/2/k Psi split for this precision; "
              "traffic counts bytes sent per rank, ring model)\n");
  std::printf("(+activations includes, for stage 3, two gathered units: the running one and the prefetched one)\n");
  // What each shard layout pads: every full buffer (stages 0-2 parameters, full gradients,
  // gathered units) and every collective carries it; each shard carries 1/N of it.
  std::printf("shard layout padding (elements added per full copy of the model, %d ranks):\n", o.ranks);
  for (ShardLayout sl : {ShardLayout::kFlat, ShardLayout::kPerParam}) {
    const ShardPlan p(layout, o.ranks, sl);
    std::printf("%s %-10s %12zu elements = %8.4f%% of Psi (%.3f MiB per %s copy)\n",
                sl == o.engine.shard_layout ? "*" : " ", ShardLayoutName(sl), p.total_padding(),
                100.0 * p.total_padding() / psi, p.total_padding() * DTypeSize(o.engine.dtype) / 1048576.0,
                DTypeName(o.engine.dtype));
  }
  std::printf("(* = --shard-layout; flat pads each unit to a multiple of N, per-param each tensor's rows)\n");
  return Status::OK();
}

}  // namespace shardgpt
