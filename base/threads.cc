// (placeholder translation unit so the base library is never empty)
namespace shardgpt {}
