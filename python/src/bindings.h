// python/src/bindings.h
//
// The parts of the lockstep._C extension, each defined in its own file and called once from the
// module's init (module.cc). Every binding is a thin call into the C++ library: values cross as
// LibTorch tensors (no copies) and errors as lockstep.errors exceptions (status.h).

#ifndef LOCKSTEP_PYTHON_SRC_BINDINGS_H_
#define LOCKSTEP_PYTHON_SRC_BINDINGS_H_

#include "pybind11/pybind11.h"

namespace lockstep {
namespace python {

void BindCheckpoint(pybind11::module_& m);      // checkpoint_bindings.cc
void BindCollectives(pybind11::module_& m);     // collectives_bindings.cc
void BindDeterminism(pybind11::module_& m);     // determinism_bindings.cc
void BindDifferentiable(pybind11::module_& m);  // differentiable_bindings.cc
void BindInvariant(pybind11::module_& m);       // invariant_bindings.cc
void BindNumerics(pybind11::module_& m);        // numerics_bindings.cc
void BindPlanner(pybind11::module_& m);         // planner_bindings.cc
void BindRecording(pybind11::module_& m);       // recording_bindings.cc
void BindRng(pybind11::module_& m);             // rng_bindings.cc
void BindTrainer(pybind11::module_& m);         // trainer_bindings.cc
void BindVariability(pybind11::module_& m);     // variability_bindings.cc

}  // namespace python
}  // namespace lockstep

#endif  // LOCKSTEP_PYTHON_SRC_BINDINGS_H_
