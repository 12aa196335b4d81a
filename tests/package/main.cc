// Links against an installed idem through find_package(idem) and runs one receive.
#include <cstdio>

#include "idem/receiver.h"
#include "idem/stores/memory.h"

int main() {
  auto store = idem::NewMemoryStore();
  idem::Receiver receiver(*store, {.scope = "package-check"});
  auto handler = [](const idem::HandlerContext&) { return idem::HandlerResult{}; };
  auto first = receiver.Receive({.key = "k"}, handler);
  auto second = receiver.Receive({.key = "k"}, handler);
  if (!first || !second || second->delivery != idem::Delivery::kReplayed) {
    std::fprintf(stderr, "package check failed\n");
    return 1;
  }
  std::printf("find_package(idem) works: second delivery was %s\n",
              std::string(idem::DeliveryName(second->delivery)).c_str());
  return 0;
}
