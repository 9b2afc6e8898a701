// Shared helpers of the IR unit tests: catching a meshfuse::UserError and printing domains.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"

namespace meshfuse::testing_helpers {

// Runs `f`, which must throw a UserError of `kind`; returns its message ("" after a failure).
// Any other outcome (no throw, InternalError, another exception) is a test failure: user input
// must never reach an internal check or escape as a raw std:: exception.
template <typename F>
std::string userErrorMessage(ErrorKind kind, F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    EXPECT_STREQ(errorKindName(e.kind()), errorKindName(kind)) << "message: " << e.message();
    return e.message();
  } catch (const InternalError& e) {
    ADD_FAILURE() << "expected a UserError but got an InternalError: " << e.what();
    return "";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a UserError but got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a UserError (" << errorKindName(kind) << ") but nothing was thrown";
  return "";
}

// Extents of a list of IterDomains as text, reduction dims prefixed with `r`: {"?t", "r64"}.
inline std::vector<std::string> extents(const std::vector<IterDomain*>& ids) {
  std::vector<std::string> out;
  for (const IterDomain* id : ids) out.push_back((id->isReduction() ? "r" : "") + id->extent().toString());
  return out;
}

inline std::vector<std::string> shapeOf(const TensorView* tv) {
  std::vector<std::string> out;
  for (const Extent& e : tv->shape()) out.push_back(e.toString());
  return out;
}

}  // namespace meshfuse::testing_helpers
