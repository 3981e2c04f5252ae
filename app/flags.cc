#include "app/flags.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "app/cli_numbers.h"
#include "app/commands.h"

namespace shardgpt {

namespace {
const std::map<std::string, DType> kDTypes{{"fp32", DType::kF32}, {"bf16", DType::kBF16}};
}  // namespace

CLI::Validator Finite(double lo, bool lo_inclusive, double hi) {
  return CLI::Validator(
      [lo, lo_inclusive, hi](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (end == in.c_str() || *end != '\0') return "expected a number, got " + in;
        const bool ok = std::isfinite(v) && (lo_inclusive ? v >= lo : v > lo) && v <= hi;
        if (ok) return "";
        std::string want = std::string(lo_inclusive ? "a finite number >= " : "a finite number > ") +
                           CLI::detail::to_string(lo);
        if (hi != HUGE_VAL) want += " and <= " + CLI::detail::to_string(hi);
        return "expected " + want + ", got " + in;
      },
      lo_inclusive ? ">= " + std::to_string(lo) : "> " + std::to_string(lo));
}

CLI::Validator IntOrAuto(long long lo, long long hi, const std::string& what) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, what, range](std::string& v) -> std::string {
        if (v == "auto") return "";
        std::string why = StrictNumber("INT", &v);
        if (!why.empty()) return "expected " + what + " in " + range + " or auto, got " + v;
        const long long n = std::stoll(v);
        return n < lo || n > hi ? "expected " + what + " in " + range + " or auto, got " + v : "";
      },
      "INT|auto");
}

std::vector<ModelFlags::Given> ModelFlags::GivenShape() const {
  std::vector<Given> out;
  const std::pair<const char*, std::pair<int, int GPTConfig::*>> flags[] = {
      {"--n-layer", {n_layer, &GPTConfig::n_layer}},
      {"--n-head", {n_head, &GPTConfig::n_head}},
      {"--n-embd", {n_embd, &GPTConfig::n_embd}},
      {"--max-seq-len", {max_seq_len, &GPTConfig::max_seq_len}},
      {"--vocab-size", {vocab_size, &GPTConfig::vocab_size}}};
  if (app != nullptr && app->count("--model") > 0) {  // a preset given: each of its fields not overridden
    auto c = PresetConfig(preset);
    if (c.ok())
      for (const auto& f : flags)
        if (f.second.first == 0)
          out.push_back({std::string("--model ") + preset + " (" + (f.first + 2) + ")", c.value().*f.second.second,
                         f.second.second});
  }
  for (const auto& f : flags)
    if (f.second.first != 0) out.push_back({f.first, f.second.first, f.second.second});
  // the llama widths (no preset sets them)
  if (n_kv_head != 0) out.push_back({"--n-kv-head", n_kv_head, &GPTConfig::n_kv_head});
  if (ffn_hidden != 0) out.push_back({"--ffn-hidden", ffn_hidden, &GPTConfig::ffn_hidden});
  return out;
}

std::vector<std::string> ModelFlags::GivenArch(const GPTConfig& imported, bool arch_given) const {
  std::vector<std::string> out;
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  if (arch_given && arch != ArchName(imported.arch))
    out.push_back("--arch " + arch + " disagrees with the imported model, whose arch is " + ArchName(imported.arch));
  if (rope_theta != 0 && static_cast<float>(rope_theta) != imported.rope_theta)
    out.push_back("--rope-theta " + num(rope_theta) + " disagrees with the imported model, whose rope_theta is " +
                  num(imported.rope_theta));
  if (norm_eps != 0 && static_cast<float>(norm_eps) != imported.norm_eps)
    out.push_back("--norm-eps " + num(norm_eps) + " disagrees with the imported model, whose norm_eps is " +
                  num(imported.norm_eps));
  if (tie_embeddings && !(imported.llama() && imported.tie_embeddings))
    out.push_back("--tie-embeddings disagrees with the imported model, whose LM head is untied");
  return out;
}

void ModelFlags::Add(CLI::App* app_in) {
  app = app_in;
  app->add_option("--model", preset, "preset: tiny, d6, d12 (GPT-2 124M), d24, d36, d48")->capture_default_str();
  app->add_option("--n-layer", n_layer, "override the preset's number of layers")->check(Finite(0, false));
  app->add_option("--n-head", n_head, "override the preset's number of heads")->check(Finite(0, false));
  app->add_option("--n-embd", n_embd, "override the preset's channels")->check(Finite(0, false));
  app->add_option("--max-seq-len", max_seq_len, "override the preset's maximum sequence length (position rows)")
      ->check(Finite(0, false));
  app->add_option("--vocab-size", vocab_size, "override the preset's vocabulary (256 for byte-level data)")
      ->check(Finite(0, false));
  app->add_option("--arch", arch, "block architecture: gpt2 (LayerNorm, learned positions, GELU, tied head) or "
                                  "llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases)")
      ->check(CLI::IsMember({"gpt2", "llama"}))->capture_default_str();
  app->add_option("--n-kv-head", n_kv_head, "llama: key/value heads, dividing --n-head (1 = multi-query; "
                                            "default --n-head)")->check(Finite(0, false));
  app->add_option("--ffn-hidden", ffn_hidden, "llama: SwiGLU hidden width (default 8/3 x n_embd rounded up to a "
                                              "multiple of 256)")->check(Finite(0, false));
  app->add_option("--rope-theta", rope_theta, "llama: rotary base theta (default 10000; Llama 3: 500000)")
      ->check(Finite(1, false));
  app->add_option("--norm-eps", norm_eps, "llama: RMSNorm epsilon (default 1e-5)")->check(Finite(0, false, 1));
  app->add_flag("--tie-embeddings", tie_embeddings, "llama: the LM head is the token embedding (default: its own "
                                                   "lm_head; gpt2 is always tied)");
}

StatusOr<GPTConfig> ModelFlags::Resolve() const {
  auto c = PresetConfig(preset);
  if (!c.ok()) return c.status();
  GPTConfig cfg = c.value();
  if (n_layer) cfg.n_layer = n_layer;
  if (n_head) cfg.n_head = n_head;
  if (n_embd) cfg.n_embd = n_embd;
  if (vocab_size) cfg.vocab_size = vocab_size;
  if (max_seq_len) cfg.max_seq_len = max_seq_len;
  if (arch == "llama") {
    cfg.arch = Arch::kLlama;
    cfg.tie_embeddings = tie_embeddings;
  } else if (tie_embeddings) {
    return Status::InvalidArgument("--tie-embeddings is a llama option: gpt2's head is always tied (use --arch llama)");
  }
  cfg.n_kv_head = n_kv_head, cfg.ffn_hidden = ffn_hidden;
  if (rope_theta != 0) cfg.rope_theta = static_cast<float>(rope_theta);
  if (norm_eps != 0) cfg.norm_eps = static_cast<float>(norm_eps);
  SHARDGPT_RETURN_IF_ERROR(cfg.Validate());
  return cfg;
}

void EngineFlags::Add(CLI::App* app) {
  app->add_option("--optimizer", optimizer, "adamw, or muon (Muon for the blocks' 2-D weight matrices, AdamW for "
                                            "embeddings, head, LayerNorms and biases)")
      ->check(CLI::IsMember({"adamw", "muon"}))->capture_default_str();
  app->add_option("--muon-momentum", muon.momentum, "Muon's momentum mu (Nesterov)")
      ->check(Finite(0, true, 1))->capture_default_str();
  app->add_option("--muon-ns-steps", muon.ns_steps, "Muon's Newton-Schulz iterations")
      ->check(CLI::Range(1, 100))->capture_default_str();
  app->add_option("--zero-stage", zero_stage, "0 = DDP, 1 = shard optimizer state, 2 = + gradients, 3 = + parameters")
      ->check(CLI::Range(0, 3))->capture_default_str();
  app->add_option("--dtype", dtype, "parameter/gradient storage: fp32 or bf16 (bf16 keeps fp32 master weights "
                                    "and AdamW moments; see --compute-dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app->add_option("--reduce-dtype", reduce_dtype, "dtype gradients travel in (default: --dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app->add_option("--bucket-mb", bucket_mb, "stage 0 gradient bucket size in MiB")->capture_default_str();
  app->add_option("--reshard-after-forward", reshard_after_forward,
                  "stage 3: free block parameters after forward (re-gathered in backward)")->capture_default_str();
  app->add_option("--reduce-grads", reduce_grads,
                  "stages 2/3 with --grad-accum > 1: every-micro (sharded memory, traffic x A) or last-micro "
                  "(traffic x 1, full-gradient memory)")
      ->check(CLI::IsMember({"every-micro", "last-micro"}))->capture_default_str();
  app->add_option("--shard-group-size", shard_group_size,
                  "HSDP (stages 1-3): shard within groups of G consecutive ranks (one node) and replicate "
                  "across the N/G groups: a number dividing the ranks, or auto (the ranks of a node); "
                  "default: all ranks (plain ZeRO)")
      ->check(IntOrAuto(1, 1 << 20, "a rank count"));
  app->add_option("--shard-layout", shard_layout,
                  "how stages >= 1 cut a unit into N shards: flat (the unit's flat buffer in N equal ranges, "
                  "FSDP1) or per-param (every parameter along dim 0, FSDP2)")
      ->check(CLI::IsMember({"flat", "per-param"}))->capture_default_str();
}

EngineOptions EngineFlags::Resolve() const {
  EngineOptions e;
  e.zero_stage = zero_stage;
  e.dtype = kDTypes.at(dtype);
  e.reduce_dtype = reduce_dtype.empty() ? e.dtype : kDTypes.at(reduce_dtype);
  e.bucket_mb = bucket_mb;
  e.reshard_after_forward = reshard_after_forward;
  e.reduce_every_micro = reduce_grads == "every-micro";
  e.shard_group_size =
      shard_group_size.empty() ? 0 : shard_group_size == "auto" ? kAutoShardGroup : std::stoi(shard_group_size);
  e.optimizer = optimizer == "muon" ? OptimizerKind::kMuon : OptimizerKind::kAdamW;
  e.muon = muon;
  e.shard_layout = shard_layout == "per-param" ? ShardLayout::kPerParam : ShardLayout::kFlat;
  return e;
}

void RecomputeFlags::Add(CLI::App* app, const char* memory_help) {
  app->add_option("--recompute", recompute,
                  "activations kept for backward: none (all), gelu (recompute the MLP's GELU in backward), block "
                  "(keep each block's input, re-run its forward before its backward)")
      ->check(CLI::IsMember({"none", "gelu", "block"}))->capture_default_str();
  app->add_option("--memory", memory, memory_help)->check(CLI::Validator(
      [](std::string& v) -> std::string {
        return ParseMemorySize(v).ok() ? "" : "expected a positive size such as 80GiB, 512MiB or 4096 (B, KiB, MiB, "
                                              "GiB, TiB, KB, MB, GB, TB), got " + v;
      },
      "SIZE"));
}

Recompute RecomputeFlags::mode() const { return ParseRecompute(recompute).value(); }
double RecomputeFlags::memory_bytes() const { return memory.empty() ? 0 : ParseMemorySize(memory).value(); }

}  // namespace shardgpt
