// The two error channels of meshfuse (DESIGN.md "Errors").
//  - UserError: bad input from a user (text, shapes, placements, meshes). Typed by ErrorKind,
//    carries a location (line:col and/or the op/tensor involved). Python maps each kind to a
//    meshfuse.Error subclass; the CLI prints it and exits non-zero.
//  - InternalError: a broken invariant inside meshfuse. Says it is a bug.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace meshfuse {

// Every kind of user error. Keep in sync with python/meshfuse/_errors.py (generated names).
#define MESHFUSE_ERROR_KINDS(X)                                                              \
  X(Parse, ParseError)             /* malformed .mf text */                                  \
  X(Shape, ShapeError)             /* shape / rank mismatch between operands */               \
  X(Dtype, DtypeError)             /* unsupported or mismatched dtype */                     \
  X(Name, NameError)               /* undefined or duplicate name */                         \
  X(Mesh, MeshError)               /* malformed mesh or mesh/world-size mismatch */          \
  X(Placement, PlacementError)     /* bad placement or DID parallelization */                \
  X(Unsupported, UnsupportedError) /* valid request that meshfuse does not support (yet) */  \
  X(Value, ValueError)             /* bad argument value (attribute, option, input data) */  \
  X(Runtime, RuntimeError)         /* failure while executing (I/O, communicator, peer) */

enum class ErrorKind {
#define MESHFUSE_X(kind, cls) kind,
  MESHFUSE_ERROR_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
};

const char* errorKindName(ErrorKind kind);  // "ParseError", ...

class UserError : public std::runtime_error {
 public:
  UserError(ErrorKind kind, std::string message)
      : std::runtime_error(message), kind_(kind), message_(std::move(message)) {}
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what)
      : std::logic_error("meshfuse internal error (this is a bug, please report it): " + what) {}
};

template <typename... Args>
[[noreturn]] void userError(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw UserError(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace meshfuse

// MF_USER_CHECK(cond, ErrorKind::X, "fmt", args...): throws a typed UserError.
#define MF_USER_CHECK(cond, kind, ...)                \
  do {                                                \
    if (!(cond)) ::meshfuse::userError(kind, __VA_ARGS__); \
  } while (0)

// MF_CHECK(cond, "fmt", args...): an internal invariant; failing it is a meshfuse bug.
#define MF_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::meshfuse::InternalError(fmt::format("{}:{}: check `{}` failed: {}", __FILE__,   \
                                                  __LINE__, #cond, fmt::format(__VA_ARGS__))); \
  } while (0)
