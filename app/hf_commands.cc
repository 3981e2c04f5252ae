#include "app/hf_commands.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "io/bpe_tokenizer.h"
#include "ckpt/checkpoint.h"
#include "io/data_loader.h"
#include "io/hf_gpt2.h"
#include "io/llmc_model.h"
#include "io/path_guard.h"
#include "io/prepare.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"

namespace shardgpt {

Status RunPrepareTokenizer(const std::string& tokenizer_json, const std::vector<std::string>& inputs,
                           const std::string& out_dir, double val_fraction, int threads,
                           const std::string& text_field) {
  {  // the shards it writes may not replace a text or the tokenizer it reads
    std::vector<NamedPath> in{{"--tokenizer", tokenizer_json}};
    for (const std::string& f : inputs) in.push_back({"--input", f});
    SHARDGPT_RETURN_IF_ERROR(CheckOutputsAgainstInputs(
        {{"--output", out_dir + "/train.bin"}, {"--output", out_dir + "/val.bin"}}, in, {}));
  }
  auto tok = BpeTokenizer::Load(tokenizer_json);
  if (!tok.ok()) return tok.status();
  BpePrepareOptions o;
  o.val_fraction = val_fraction;
  o.threads = threads;
  o.progress = true;
  o.text_field = text_field;
  PrepareStats stats;
  SHARDGPT_RETURN_IF_ERROR(PrepareBpe(*tok.value(), inputs, out_dir, o, &stats));
  const double s = std::max(stats.seconds, 1e-9);
  std::printf("prepared %llu tokens (vocab %d, BPE from %s) of %.2f MB of text in %.2f s: %.0f tokens/s, %.2f MB/s on "
              "%d thread(s); %s (%llu), %s (%llu), uint%d tokens\n",
              static_cast<unsigned long long>(stats.total_tokens), tok.value()->vocab_size(), tokenizer_json.c_str(),
              stats.input_bytes / 1e6, stats.seconds, stats.total_tokens / s, stats.input_bytes / 1e6 / s, threads,
              stats.train_path.c_str(), static_cast<unsigned long long>(stats.train_tokens), stats.val_path.c_str(),
              static_cast<unsigned long long>(stats.val_tokens), 8 * stats.token_bytes);
  return Status::OK();
}

namespace {

// The model at `path`: an llm.c file or HF directory / .safetensors (LlmcModelReader), else a
// checkpoint or --ckpt-dir.
StatusOr<LlmcModel> LoadAnyModel(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec) || IsHfGpt2Path(path)) return ReadLlmcModel(path);
  return LoadCheckpointFullModel(path);
}

// All ranks agree: the first failing rank's message on rank 0, empty messages elsewhere.
Status AgreeWorld(const Status& local) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int bad = local.ok() ? world : rank;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (bad == world) return Status::OK();
  constexpr int kLen = 1024;
  char msg[kLen] = {};
  if (rank == bad) std::snprintf(msg, kLen, "%s", local.message().c_str());
  MPI_Bcast(msg, kLen, MPI_CHAR, bad, MPI_COMM_WORLD);
  return Status::InvalidArgument(rank == 0 ? std::string(msg) : std::string());
}

}  // namespace

Status RunEval(const EvalOptions& o) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  SetComputeThreads(o.threads);
  if (!o.logits_out.empty()) {  // --logits-out may not replace the model or a data file read
    std::vector<NamedPath> files, dirs;
    AddModelInput("model", o.model, &files, &dirs);
    std::vector<std::string> data;
    if (ExpandShardPattern(o.data, &data).ok())  // no match: the loader says so below
      for (const std::string& f : data) files.push_back({"--data", f});
    SHARDGPT_RETURN_IF_ERROR(AgreeWorld(CheckOutputsAgainstInputs({{"--logits-out", o.logits_out}}, files, dirs)));
  }
  auto model = LoadAnyModel(o.model);
  SHARDGPT_RETURN_IF_ERROR(AgreeWorld(model.status()));
  const GPTConfig cfg = model->config;
  const int T = o.seq_len > 0 ? o.seq_len : cfg.max_seq_len;
  Status st;
  if (T > cfg.max_seq_len)
    st = Status::InvalidArgument("eval: --seq-len " + std::to_string(T) + " exceeds the model's max_seq_len " +
                                 std::to_string(cfg.max_seq_len));
  if (st.ok() && o.micro_batch < 1) st = Status::InvalidArgument("eval: --micro-batch must be >= 1");
  if (st.ok() && o.batches < 0) st = Status::InvalidArgument("eval: --batches must be >= 0 (0: every window)");
  SHARDGPT_RETURN_IF_ERROR(AgreeWorld(st));
  DataLoaderOptions lo;
  lo.pattern = o.data;
  lo.B = 1;
  lo.T = T;
  lo.shuffle = false;
  lo.vocab_size = cfg.vocab_size;
  auto loader = DataLoader::Open(lo);
  SHARDGPT_RETURN_IF_ERROR(AgreeWorld(loader.status()));
  const uint64_t B = static_cast<uint64_t>(o.micro_batch), S = loader->num_samples();
  const uint64_t windows = o.batches > 0 ? std::min<uint64_t>(S, static_cast<uint64_t>(o.batches) * B) : S;
  const uint64_t nbatches = (windows + B - 1) / B;

  // The model copy and the activations of one micro-batch (the logits alone are B x T x vocab
  // floats): out of memory on any rank is one agreed line naming what to lower.
  ParamLayout layout(cfg);
  std::unique_ptr<LocalParams> local;
  std::unique_ptr<GPT> gpt_owner;
  std::vector<int32_t> inputs, targets;
  try {
    local = std::make_unique<LocalParams>(layout);
    std::copy(model->params.begin(), model->params.end(), local->params());
    std::vector<float>().swap(model->params);  // the copy in `local` is the one used
    gpt_owner = std::make_unique<GPT>(cfg, o.micro_batch, T);
    inputs.resize(B * T), targets.resize(B * T);
  } catch (const std::exception& e) {  // DeviceOutOfMemory, std::bad_alloc
    std::string what = e.what();
    what = what.substr(0, what.find(';'));
    if (what.rfind("out of host memory", 0) != 0) what = "out of host memory (" + what + ")";
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "eval: %s for --micro-batch %d x --seq-len %d (the logits alone are %.3f GiB: B x T x vocab %d x 4 "
                  "bytes); give a smaller --micro-batch or --seq-len",
                  what.c_str(), o.micro_batch, T, static_cast<double>(B) * T * cfg.vocab_size * 4 / 1073741824.0,
                  cfg.vocab_size);
    st = Status::Internal(buf);
  }
  SHARDGPT_RETURN_IF_ERROR(AgreeWorld(st));
  GPT& gpt = *gpt_owner;
  double sums[2] = {0, 0};  // sum of per-token losses, tokens
  for (uint64_t b = static_cast<uint64_t>(rank); b < nbatches; b += static_cast<uint64_t>(world)) {
    const uint64_t first = b * B, n = std::min(B, windows - first);
    for (uint64_t i = 0; i < n; i++) loader->SampleTokens(first + i, &inputs[i * T], &targets[i * T]);
    const float mean = gpt.Forward(*local, inputs.data(), targets.data(), static_cast<int>(n), T, 0.0f);
    sums[0] += static_cast<double>(mean) * static_cast<double>(n * T);
    sums[1] += static_cast<double>(n * T);
    if (b == 0 && !o.logits_out.empty()) {
      FILE* f = std::fopen(o.logits_out.c_str(), "wb");
      bool ok = f != nullptr;
      for (uint64_t r = 0; ok && r < n * T; r++) {
        const std::vector<float> row = gpt.LogitsRow(static_cast<int>(r));
        ok = std::fwrite(row.data(), 4, cfg.vocab_size, f) == static_cast<size_t>(cfg.vocab_size);
      }
      if (f) ok = std::fclose(f) == 0 && ok;
      if (!ok) st = Status::IOError(o.logits_out + ": cannot write the logits");
    }
  }
  SHARDGPT_RETURN_IF_ERROR(AgreeWorld(st));
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const double loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  if (rank == 0)
    std::printf("{\"loss\": %.9g, \"perplexity\": %.9g, \"tokens\": %.0f, \"windows\": %llu, \"seq_len\": %d, "
                "\"micro_batch\": %d, \"ranks\": %d, \"model\": \"%s\"}\n",
                loss, std::exp(loss), sums[1], static_cast<unsigned long long>(windows), T, o.micro_batch, world,
                cfg.ToString().c_str());
  return Status::OK();
}

}  // namespace shardgpt
