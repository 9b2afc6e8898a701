// The `meshfuse._C` extension module. The user API lives in the Python package around it.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "meshfuse's C++ core (internal; use the meshfuse package)";
  meshfuse::python::bindErrors(m);  // first: the other bindings' errors translate to these
  meshfuse::python::bindIr(m);
  meshfuse::python::bindTensor(m);
  meshfuse::python::bindRuntime(m);
  meshfuse::python::bindTraining(m);
}
