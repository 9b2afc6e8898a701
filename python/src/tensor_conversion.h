// Python object -> meshfuse Tensor, shared by the tensor and runtime bindings.
#pragma once

#include <pybind11/pybind11.h>

#include "meshfuse/tensor.h"

namespace meshfuse::python {

// A meshfuse.Tensor as is; a DLPack capsule or any object with __dlpack__ (numpy, torch) viewed
// without a copy (the Tensor keeps the producer's memory alive). Throws a UserError on a
// non-CPU, non-contiguous or unsupported-dtype tensor.
Tensor tensorFromPython(pybind11::handle obj);

}  // namespace meshfuse::python
