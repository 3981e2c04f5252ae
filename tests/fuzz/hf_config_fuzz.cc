// Fuzz target: Hugging Face config.json files, GPT-2's (io/hf_gpt2.h, ParseHfGpt2Config) and
// Llama's (io/hf_llama.h, ParseHfLlamaConfig), with the JSON type mutator (json_mutate.h) beside
// libFuzzer's byte mutations.
// Contract: any text gives either an error (one line naming the file) or a config that passes
// GPTConfig::Validate with every size positive; nothing crashes (no thrown type_error).
#include "fuzz_util.h"
#include "io/hf_gpt2.h"
#include "io/hf_llama.h"
#include "json_mutate.h"

using namespace shardgpt;

SHARDGPT_FUZZ_JSON_MUTATOR()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string what = "dir/config.json", text(reinterpret_cast<const char*>(data), size);
  for (bool llama : {false, true}) {
    auto c = llama ? ParseHfLlamaConfig(what, text) : ParseHfGpt2Config(what, text);
    if (!c.ok()) {
      fuzz::CheckError(c.status(), what);
      continue;
    }
    FUZZ_CHECK(c.value().Validate().ok(), "accepted an invalid config: %s", c.value().Validate().message().c_str());
    FUZZ_CHECK(c.value().n_layer > 0 && c.value().n_head > 0 && c.value().n_embd > 0 && c.value().max_seq_len > 0 &&
                   c.value().vocab_size > 0,
               "a size is not positive");
    FUZZ_CHECK(c.value().llama() == llama, "the parser gave the other architecture");
  }
  return 0;
}
