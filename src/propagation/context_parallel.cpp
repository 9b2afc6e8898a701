// The names of the context-parallel strategies (PropagationOptions::context_parallel), shared by
// the CLI's --cp and Python's cp= so that neither maps them by hand.
#include <fmt/format.h>

#include "meshfuse/error.h"
#include "meshfuse/options.h"

namespace meshfuse {

ContextParallel parseContextParallel(const std::string& name) {
  if (name == "auto") return ContextParallel::Auto;
  if (name == "ulysses") return ContextParallel::Ulysses;
  if (name == "gather") return ContextParallel::Gather;
  userError(ErrorKind::Value, "context parallelism '{}': expected auto, ulysses or gather", name);
}

}  // namespace meshfuse
