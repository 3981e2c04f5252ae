#include "app/ckpt_commands.h"

#include <cstdio>
#include <filesystem>

#include "base/clock.h"
#include "ckpt/checkpoint.h"
#include "io/hf_gpt2.h"
#include "io/hf_llama.h"
#include "io/llmc_model.h"
#include "io/path_guard.h"

namespace shardgpt {

namespace {


std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

Status RunCkptVerify(const std::string& path) {
  const double t0 = MonotonicSeconds();
  CheckpointIndex idx;
  uint64_t bytes = 0;
  SHARDGPT_RETURN_IF_ERROR(VerifyCheckpoint(path, &idx, &bytes));
  const double s = MonotonicSeconds() - t0;
  std::printf("ok: %s: step %lld, model %s, saved by %d rank(s) at stage %d; %zu shard file(s), %.3f GB of state "
              "read and checked (CRC-32C and Fletcher32 per chunk, CRC-32C per dataset) in %.2f s\n",
              idx.dir.c_str(), static_cast<long long>(idx.state.step), idx.config.ToString().c_str(), idx.ranks,
              idx.zero_stage, idx.files.size(), bytes / 1e9, s);
  return Status::OK();
}

Status RunCkptInspect(const std::string& path) {
  auto dir = ResolveCheckpoint(path, "");
  if (!dir.ok()) return dir.status();
  auto read = ReadCheckpointIndex(dir.value());
  if (!read.ok()) return read.status();
  const CheckpointIndex& idx = read.value();
  std::printf("checkpoint %s\n", idx.dir.c_str());
  std::printf("  format version   %d (id %016llx)\n", idx.format_version,
              static_cast<unsigned long long>(idx.checkpoint_id));
  std::printf("  model            %s (padded vocab %d)\n", idx.config.ToString().c_str(), idx.config.padded_vocab());
  std::printf("  saved by         %d rank(s), zero stage %d, dtype %s, optimizer %s, shard layout %s\n",
              idx.ranks, idx.zero_stage, idx.dtype.c_str(), idx.optimizer.c_str(), idx.shard_layout.c_str());
  if (idx.shard_group_size < idx.ranks)
    std::printf("  HSDP             shard groups of %d rank(s), %d group(s); group 0 wrote the %d file(s) (the other "
                "groups held the same shards)\n", idx.shard_group_size, idx.ranks / idx.shard_group_size, idx.world_size);
  std::printf("  step             %lld (LR schedule position and AdamW t)\n", static_cast<long long>(idx.state.step));
  std::printf("  tokens           %lld\n", static_cast<long long>(idx.state.tokens));
  std::printf("  loader position  %llu\n", static_cast<unsigned long long>(idx.state.loader_position));
  std::printf("  seed             %llu\n", static_cast<unsigned long long>(idx.state.seed));
  uint64_t elems = 0;
  for (const CheckpointFile& f : idx.files) elems += f.elements;
  std::printf("  shard files      %zu, %llu elements x 3 (master, m, v), %.3f MB on disk\n", idx.files.size(),
              static_cast<unsigned long long>(elems), idx.total_bytes() / 1e6);
  for (const CheckpointFile& f : idx.files)
    std::printf("    %-16s %12llu elements %14llu bytes  crc32c master %08x m %08x v %08x\n", f.name.c_str(),
                static_cast<unsigned long long>(f.elements), static_cast<unsigned long long>(f.bytes), f.crc_master,
                f.crc_m, f.crc_v);
  std::printf("  chunks (tensor [global shape]: offsets + sizes -> file @ element offset)\n");
  for (const SavedChunk& c : idx.chunks) {
    std::vector<int64_t> off(c.offsets.begin(), c.offsets.end()), size(c.sizes.begin(), c.sizes.end());
    std::printf("    %-28s %-14s %s + %s -> %s @ %llu\n", idx.tensors[c.tensor].name.c_str(),
                Shape(idx.tensors[c.tensor].shape).c_str(), Shape(off).c_str(), Shape(size).c_str(),
                idx.files[c.file].name.c_str(), static_cast<unsigned long long>(c.file_offset));
  }
  size_t total = 0;
  std::printf("  tensors (%zu)\n", idx.tensors.size());
  for (const TensorInfo& t : idx.tensors) {
    std::printf("    %-28s %-14s unit %-6s offset %10zu numel %10zu\n", t.name.c_str(), Shape(t.shape).c_str(),
                idx.units[t.unit].name.c_str(), t.offset, t.numel);
    total += t.numel;
  }
  std::printf("  parameters       %zu (%.2fM)\n", total, total / 1e6);
  return Status::OK();
}

Status RunExport(const std::string& path, const ExportOptions& o) {
  if (o.out_h5.empty() && o.out_llmc.empty() && o.out_hf.empty())
    return Status::InvalidArgument("export: give at least one of --out FILE.h5, --llmc FILE.bin or --hf DIR");
  if (o.hf_dtype != "fp32" && o.hf_dtype != "bf16")
    return Status::InvalidArgument("export: --export-dtype " + o.hf_dtype + " (expected fp32 or bf16)");
  // A regular file is an llm.c model (or a .safetensors), a directory with config.json an HF
  // model; anything else a checkpoint or a --ckpt-dir.
  std::error_code ec;
  const bool model_file = std::filesystem::is_regular_file(path, ec) || IsHfGpt2Path(path);
  {  // nothing written over the model read, or into the checkpoint read (a --ckpt-dir's other
     // files are not inputs)
    const std::vector<NamedPath> outputs = {
        {"--out", o.out_h5},
        {"--llmc", o.out_llmc},
        {"--hf", o.out_hf.empty() ? "" : o.out_hf + "/config.json"},
        {"--hf", o.out_hf.empty() ? "" : o.out_hf + "/model.safetensors"},
        {"--hf", o.out_hf.empty() ? "" : o.out_hf + "/model.safetensors.index.json"}};
    if (model_file) {
      std::vector<NamedPath> files, dirs;
      AddModelInput("model", path, &files, &dirs);
      SHARDGPT_RETURN_IF_ERROR(CheckOutputsAgainstInputs(outputs, files, dirs));
    } else {
      auto dir = ResolveCheckpoint(path, "");
      if (!dir.ok()) return dir.status();
      SHARDGPT_RETURN_IF_ERROR(CheckOutputsAgainstInputs(outputs, {}, {{"checkpoint", dir.value()}}));
    }
  }
  auto model = model_file ? ReadLlmcModel(path) : LoadCheckpointFullModel(path);
  if (!model.ok()) return model.status();
  const ParamLayout layout(model->config);
  if (!o.out_h5.empty()) {
    SHARDGPT_RETURN_IF_ERROR(WriteFullModelH5(o.out_h5, layout, model->params.data()));
    std::printf("exported %zu tensors (%zu parameters) to %s\n", layout.tensors().size(), layout.total_numel(),
                o.out_h5.c_str());
  }
  if (!o.out_llmc.empty()) {
    SHARDGPT_RETURN_IF_ERROR(WriteLlmcModel(o.out_llmc, layout, model->params.data()));
    std::printf("exported the model to %s (llm.c format, version 3)\n", o.out_llmc.c_str());
  }
  if (!o.out_hf.empty() && model->config.llama()) {
    auto shard = HfMaxShardBytes();
    if (!shard.ok()) return shard.status();
    SHARDGPT_RETURN_IF_ERROR(WriteHfLlama(o.out_hf, layout, model->params.data(), o.hf_dtype == "bf16", shard.value()));
    std::printf("exported the model to %s (Hugging Face LlamaForCausalLM: config.json + safetensors, %s)\n",
                o.out_hf.c_str(), o.hf_dtype.c_str());
  } else if (!o.out_hf.empty()) {
    SHARDGPT_RETURN_IF_ERROR(WriteHfGpt2(o.out_hf, layout, model->params.data(), o.hf_dtype == "bf16"));
    std::printf("exported the model to %s (Hugging Face GPT2LMHeadModel: config.json + model.safetensors, %s)\n",
                o.out_hf.c_str(), o.hf_dtype.c_str());
  }
  return Status::OK();
}

}  // namespace shardgpt
