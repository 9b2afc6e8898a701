// The compile options as CLI11 flags (cli_options.h).
#include "cli_options.h"

#include "meshfuse/error.h"

namespace meshfuse::cli {

void addCompileOptions(CLI::App& sub, PipelineOptions& pipeline) {
  const PipelineOptions defaults;
  for (const CompileOption& o : compileOptions()) {
    const std::string flag = "--" + o.name;
    if (o.type == CompileOption::Type::Flag) {
      sub.add_flag_callback(flag, [&pipeline, &o] { o.set(pipeline, "true"); }, o.help);
      continue;
    }
    // A bad value is reported by CLI11 like its own parse errors (usage, exit code 106 ...), with
    // the table's message.
    CLI::Option* opt = sub.add_option_function<std::string>(
        flag,
        [&pipeline, &o, flag](const std::string& v) {
          try {
            o.set(pipeline, v);
          } catch (const UserError& e) {
            throw CLI::ValidationError(flag, e.message());
          }
        },
        o.help);
    opt->default_str(o.get(defaults));
    if (o.type == CompileOption::Type::Choice) opt->check(CLI::IsMember(o.choices));
  }
}

}  // namespace meshfuse::cli
