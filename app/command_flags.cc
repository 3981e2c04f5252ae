#include "app/command_flags.h"

#include <cstdio>

#include "app/diagnose.h"
#include "app/trace.h"

#include <algorithm>
#include <thread>

#include "model/compute_precision.h"

namespace shardgpt {

void PrepareFlags::Register(CLI::App& app) {
  command = app.add_subcommand("prepare", "turn text or JSONL files (gzip'd or not) into token shards train.bin / val.bin");
  command->add_option("--input", inputs, "text files (one document each) or JSON Lines files .jsonl, .jsonl.gz, "
                                         ".json.gz (one document per line); any gzip'd file is read decompressed")
      ->required()->expected(1, -1);
  command->add_option("--output", out, "output directory")->required();
  command->add_option("--val-fraction", val_fraction, "share of tokens (the end of the text) for val.bin")->capture_default_str();
  command->add_option("--tokenizer", tokenizer, "a Hugging Face byte-level BPE tokenizer.json (GPT-2's kind); "
                                                "default: byte-level tokens");
  command->add_option("--threads", threads, "encoding threads with --tokenizer (default: the cores)")
      ->check(CLI::Range(1, 1024));
  command->add_option("--text-field", text_field, "the string field of each JSONL record that holds its text")
      ->capture_default_str();
}

Status PrepareFlags::Run(const Launcher& launcher) const {
  if (launcher.rank() != 0) return Status::OK();
  if (!tokenizer.empty())
    return RunPrepareTokenizer(tokenizer, inputs, out, val_fraction,
                               threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency()), text_field);
  return RunPrepare(inputs, out, val_fraction, text_field);
}

void SampleFlags::Register(CLI::App& app) {
  SampleOptions& s = options;
  command = app.add_subcommand("sample", "generate text from a trained model");
  auto* model_file_opt = command->add_option("--model-file", s.model_file, "llm.c model .bin (as written by train --save-model)");
  command->add_option("--checkpoint", s.checkpoint, "a checkpoint directory (or a --ckpt-dir: its latest)")->excludes(model_file_opt);
  command->add_option("--tokenizer", s.tokenizer_file, "llm.c tokenizer .bin to decode GPT-2 ids, or a Hugging Face "
                                                     "tokenizer.json (BPE: also encodes --prompt); default: bytes");
  auto* prompt_opt = command->add_option("--prompt", s.prompt, "prompt text (byte-level models) ")->capture_default_str();
  // one prompt: --prompt and --prompt-ids exclude each other
  command->add_option("--prompt-ids", s.prompt_ids, "prompt as token ids (any tokenizer)")->excludes(prompt_opt);
  command->add_option("-n,--tokens", s.tokens, "tokens to generate")->capture_default_str();
  command->add_option("--temperature", s.temperature, "softmax temperature (0: greedy)")->capture_default_str();
  command->add_option("--top-k", s.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  command->add_option("--seed", s.seed, "sampling seed")->capture_default_str();
}

Status SampleFlags::Run(const Launcher& launcher) const {
  return launcher.rank() == 0 ? RunSample(options, launcher.default_threads()) : Status::OK();
}

void EvalFlags::Register(CLI::App& app) {
  EvalOptions& ev = options;
  command = app.add_subcommand("eval", "mean loss and perplexity of a model over the consecutive windows of "
                                       "token files (one JSON line; 1-N ranks)");
  command->add_option("model", ev.model, "llm.c model .bin, Hugging Face GPT-2 or Llama directory, checkpoint or --ckpt-dir")
      ->required();
  command->add_option("--data", ev.data, "glob of token shards")->required();
  command->add_option("-t,--seq-len", ev.seq_len, "tokens per window (default: the model's max_seq_len)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("-b,--micro-batch", ev.micro_batch, "windows per forward pass")->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  command->add_option("--batches", ev.batches, "micro-batches in all, over every rank (default: every window)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  command->add_option("--logits-out", ev.logits_out, "write the first micro-batch's logits [B, T, vocab] as raw fp32");
  command->add_option("--threads", ev.threads, "compute threads per rank (default: cores / ranks on the node)")
      ->check(CLI::Range(1, 1024));
}

Status EvalFlags::Run(const Launcher& launcher) const {
  EvalOptions ev = options;
  if (ev.threads <= 0) ev.threads = launcher.default_threads();
  return RunEval(ev);
}

void PlanFlags::Register(CLI::App& app) {
  PlanOptions& p = options;
  command = app.add_subcommand("plan", "print per-rank memory and per-step traffic for a configuration, without training");
  model.Add(command);
  engine.Add(command);
  command->add_option("--ranks", p.ranks, "data-parallel ranks")->check(Finite(0, false))->capture_default_str();
  command->add_option("-b,--micro-batch", p.micro_batch, "sequences per rank per micro-batch")
      ->check(Finite(0, false, 1000000))->capture_default_str();
  command->add_option("-t,--seq-len", p.seq_len, "tokens per sequence")->check(Finite(0, false))->capture_default_str();
  command->add_option("--grad-accum", p.grad_accum, "micro-batches per step")->check(Finite(0, false))->capture_default_str();
  command->add_option("--mem-gib", p.mem_gib, "memory per rank in GiB: mark which stages fit")->check(Finite(0, false));
  command->add_option("--device", p.device, "cpu, or cuda: with --comm nccl a row for NCCL's own buffers (an estimate)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  command->add_option("--comm", p.comm, "data-plane communicator: auto (nccl with --device cuda), mpi, nccl")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}))->capture_default_str();
  command->add_option("--ranks-per-node", p.ranks_per_node,
                      "ranks (GPUs) per node, for NCCL's buffers (default: --ranks, at most 8)")
      ->check(Finite(0, false));
  command->add_flag("--nvls", p.nvls,
                    "count NCCL's NVLink SHARP (NVLS) buffers, as on NVSwitch nodes (H100/H200/B200 SXM) where NCCL "
                    "enables NVLS by default (NCCL_NVLS_ENABLE=0 in the environment turns it off)");
  command->add_option("--act-dtype", act_dtype,
                      "dtype of the activations counted: auto (bf16 with --dtype bf16, as on a GPU), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  recompute.Add(command, "memory per rank, e.g. 80GiB: print the largest micro-batch that fits for each ZeRO stage "
                         "x --recompute mode");
}

Status PlanFlags::Run(const Launcher& launcher) const {
  auto cfg = model.Resolve();
  if (!cfg.ok()) return cfg.status();
  PlanOptions p = options;
  p.model = cfg.value();
  p.engine = engine.Resolve();
  p.recompute = recompute.mode();
  p.memory_bytes = recompute.memory_bytes();
  auto act = PlannedActivationDType(act_dtype, p.engine.dtype);
  if (!act.ok()) return act.status();
  p.engine.act_dtype = act.value();
  if (p.engine.shard_group_size == kAutoShardGroup)
    return Status::InvalidArgument("plan --shard-group-size auto: plan runs on no nodes; give the ranks per node as a number");
  return launcher.rank() == 0 ? RunPlan(p) : Status::OK();
}

void CkptFlags::Register(CLI::App& app) {
  command = app.add_subcommand("ckpt", "check or describe a sharded checkpoint");
  command->require_subcommand(1);
  verify = command->add_subcommand("verify", "verify every shard's checksum and size without training");
  verify->add_option("path", path, "checkpoint directory (or a --ckpt-dir: its latest)")->required();
  inspect = command->add_subcommand("inspect", "print a checkpoint's index");
  inspect->add_option("path", path, "checkpoint directory (or a --ckpt-dir: its latest)")->required();
}

Status CkptFlags::Run(const Launcher& launcher) const {
  if (launcher.rank() != 0) return Status::OK();
  return *verify ? RunCkptVerify(path) : RunCkptInspect(path);
}

void DiagnoseFlags::Register(CLI::App& app) {
  command = app.add_subcommand("diagnose", "say which rank stopped a hung or crashed job, doing what, from its flight "
                                           "recorder dumps (exit 0: nothing wrong found, 3: a verdict, 1: unreadable)");
  CLI::Option_group* what = command->add_option_group("what", "the dumps' folder, or --merge-trace");
  what->add_option("dir", dir, "the folder of rank_XXXXX.json dumps (--flight-dir, or CKPT_DIR/flight)");
  what->add_option("--merge-trace", merge_trace,
                   "merge the trace_rank_XXXXX.json files of train --trace DIR into one trace (a process per rank) "
                   "for Perfetto, chrome://tracing or scripts/plot.py --trace");
  what->require_option(1);
  command->add_option("-o,--output", output, "the merged trace (with --merge-trace; default DIR/trace_merged.json)");
  command->add_flag("--json", json, "print the verdict as one JSON object");
}

Status DiagnoseFlags::Run(const Launcher& launcher, int* exit_code) const {
  if (launcher.rank() != 0) return Status::OK();
  if (!merge_trace.empty()) {
    const std::string out = output.empty() ? merge_trace + "/trace_merged.json" : output;
    int ranks = 0;
    SHARDGPT_RETURN_IF_ERROR(MergeTraces(merge_trace, out, &ranks));
    std::printf("merged the traces of %d rank(s) into %s (open it in https://ui.perfetto.dev or chrome://tracing; "
                "draw it: scripts/plot.py --trace %s -o timeline.png)\n",
                ranks, out.c_str(), out.c_str());
    return Status::OK();
  }
  if (!output.empty()) return Status::InvalidArgument("diagnose: --output is the merged trace's file: give --merge-trace DIR");
  auto report = Diagnose(dir);
  if (!report.ok()) return report.status();
  if (json) std::printf("%s\n", DiagnoseToJson(report.value()).dump(1).c_str());
  else std::printf("%s", FormatDiagnose(report.value()).c_str());
  *exit_code = report.value().verdict == "all-idle" ? 0 : kDiagnoseFound;
  return Status::OK();
}

void ExportFlags::Register(CLI::App& app) {
  command = app.add_subcommand("export", "write a checkpoint or model as one consolidated HDF5 file, an llm.c "
                                         ".bin and/or a Hugging Face GPT-2 or Llama directory");
  command->add_option("path", path, "checkpoint directory (or a --ckpt-dir: its latest), llm.c model .bin or HF "
                                    "GPT-2 / Llama directory")->required();
  command->add_option("--out", options.out_h5, "consolidated HDF5 file, one dataset per parameter at full shape");
  command->add_option("--llmc", options.out_llmc, "write an llm.c model .bin (version 3, fp32)");
  command->add_option("--hf", options.out_hf, "write a Hugging Face directory: config.json + model.safetensors "
                                              "(GPT2LMHeadModel, or LlamaForCausalLM for --arch llama, sharded above "
                                              "2 GiB or SHARDGPT_HF_MAX_SHARD_BYTES)");
  command->add_option("--export-dtype", options.hf_dtype, "dtype of the --hf weights: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
}

Status ExportFlags::Run(const Launcher& launcher) const {
  return launcher.rank() == 0 ? RunExport(path, options) : Status::OK();
}

}  // namespace shardgpt
