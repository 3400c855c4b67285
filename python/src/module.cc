// lockstep._C: the extension module behind the lockstep Python package (python/lockstep).
// Imported by lockstep/__init__.py after torch and torch.distributed, whose pybind11 types
// (Tensor, Device, ProcessGroup) the bindings take.

#include "pybind11/pybind11.h"
#include "python/src/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "lockstep's C++ libraries, bound for Python (use the lockstep package, not this)";
  lockstep::python::BindCheckpoint(m);
  lockstep::python::BindCollectives(m);
  lockstep::python::BindDeterminism(m);
  lockstep::python::BindDifferentiable(m);
  lockstep::python::BindInvariant(m);
  lockstep::python::BindNumerics(m);
  lockstep::python::BindPlanner(m);
  lockstep::python::BindRecording(m);
  lockstep::python::BindRng(m);
  lockstep::python::BindTrainer(m);
  lockstep::python::BindVariability(m);
}
