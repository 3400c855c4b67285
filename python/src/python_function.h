// python/src/python_function.h
//
// Python callables handed to C++ that may call them and drop them from any thread (autograd's
// engine runs a checkpoint's recompute without the GIL): PythonFunction drops its reference with
// the GIL held, and Block wraps a Python block of tensors -> tensors as a checkpoint function.

#ifndef LOCKSTEP_PYTHON_SRC_PYTHON_FUNCTION_H_
#define LOCKSTEP_PYTHON_SRC_PYTHON_FUNCTION_H_

#include <memory>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {

struct PythonFunction {
  explicit PythonFunction(pybind11::function f) : fn(std::move(f)) {}
  ~PythonFunction() {
    pybind11::gil_scoped_acquire gil;
    fn = pybind11::function();
  }
  pybind11::function fn;
};

// `fn(list of tensors) -> sequence of tensors` as a checkpoint block, callable with or without
// the GIL held. A Python exception leaves as a C++ exception carrying its text.
inline checkpoint::CheckpointedFunction Block(pybind11::function fn) {
  auto held = std::make_shared<PythonFunction>(std::move(fn));
  return [held](const std::vector<at::Tensor>& inputs) {
    pybind11::gil_scoped_acquire gil;
    return held->fn(pybind11::cast(inputs)).cast<std::vector<at::Tensor>>();
  };
}

}  // namespace python
}  // namespace lockstep

#endif  // LOCKSTEP_PYTHON_SRC_PYTHON_FUNCTION_H_
