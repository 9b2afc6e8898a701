// meshfuse.Error and one subclass per user-error kind, generated from MESHFUSE_ERROR_KINDS, and
// the translator that turns a C++ UserError into the matching Python class with the same
// message. An InternalError (a meshfuse bug) stays a plain RuntimeError: it is not the user's.
#include <array>

#include "bindings.h"
#include "meshfuse/error.h"

namespace meshfuse::python {
namespace {

constexpr size_t kNumKinds = 0
#define MESHFUSE_X(kind, cls) +1
    MESHFUSE_ERROR_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
    ;

// Owned by the module (as attributes); the interpreter keeps them alive while it runs.
std::array<PyObject*, kNumKinds> g_classes{};

}  // namespace

void bindErrors(py::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc("meshfuse.Error",
                                             "Base class of every meshfuse user error (bad shapes, placements, "
                                             "meshes, dtypes, ...).",
                                             PyExc_Exception, nullptr);
  m.attr("Error") = py::handle(base);
#define MESHFUSE_X(kind, cls)                                                                  \
  g_classes[static_cast<size_t>(ErrorKind::kind)] =                                           \
      PyErr_NewExceptionWithDoc("meshfuse." #cls, "meshfuse user error: " #kind, base, nullptr); \
  m.attr(#cls) = py::handle(g_classes[static_cast<size_t>(ErrorKind::kind)]);
  MESHFUSE_ERROR_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
  m.attr("ERROR_KINDS") = [] {
    py::list names;
#define MESHFUSE_X(kind, cls) names.append(#cls);
    MESHFUSE_ERROR_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
    return names;
  }();

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UserError& e) {
      PyErr_SetString(g_classes[static_cast<size_t>(e.kind())], e.message().c_str());
    } catch (const InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace meshfuse::python
