#include "io/json_fields.h"

namespace shardgpt {

std::string JsonBrief(const nlohmann::json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size());
  if (v.is_object()) return "an object of " + std::to_string(v.size());
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    return s.size() > 40 ? Quoted(s.substr(0, 40)) + "..." : Quoted(s);
  }
  if (v.is_discarded()) return "nothing";
  return v.dump();  // a scalar: number, boolean or null
}

std::string JsonTypeName(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "nothing";
}

const nlohmann::json* JsonMember(const nlohmann::json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

StatusOr<bool> JsonOptionalBool(const std::string& what, const nlohmann::json& o, const std::string& where,
                                const char* key, bool fallback, bool null_is_absent) {
  const nlohmann::json* v = JsonMember(o, key);
  if (!v || (null_is_absent && v->is_null())) return fallback;
  if (!v->is_boolean())
    return Status::InvalidArgument(what + ": " + where + key + " is " + JsonBrief(*v) + " (expected true or false)");
  return v->get<bool>();
}

StatusOr<std::string> JsonOptionalString(const std::string& what, const nlohmann::json& o, const std::string& where,
                                         const char* key, const std::string& fallback, bool null_is_absent) {
  const nlohmann::json* v = JsonMember(o, key);
  if (!v || (null_is_absent && v->is_null())) return fallback;
  if (!v->is_string())
    return Status::InvalidArgument(what + ": " + where + key + " is " + JsonBrief(*v) + " (expected a string)");
  return v->get<std::string>();
}

}  // namespace shardgpt
