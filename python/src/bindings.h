// The pybind11 extension `meshfuse._C`: one bind function per family, called from module.cpp.
// The Python package (python/meshfuse) builds the user API on top of these.
#pragma once

#include <pybind11/pybind11.h>

namespace meshfuse::python {

namespace py = pybind11;

void bindErrors(py::module_& m);   // meshfuse.Error and one subclass per ErrorKind
void bindIr(py::module_& m);       // DataType, ParallelType, DeviceMesh, Placement, Fusion, TensorView, ops
void bindTensor(py::module_& m);   // Tensor: zero-copy DLPack in and out
void bindRuntime(py::module_& m);  // the communicator, executors, compiled programs
void bindTraining(py::module_& m); // optimizer fusions

}  // namespace meshfuse::python
