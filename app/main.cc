// shardgpt executable entry point (work in progress: subcommands are being wired up).
#include <cstdio>
int main() { std::fprintf(stderr, "shardgpt: not built yet\n"); return 1; }
