// python/src/tolerance.h
//
// The tolerance keywords every comparing binding takes (atol, rtol, relative_l2, nan_equal,
// bitwise; the defaults numerics::Tolerance's), made into a checked numerics::Tolerance.

#ifndef LOCKSTEP_PYTHON_SRC_TOLERANCE_H_
#define LOCKSTEP_PYTHON_SRC_TOLERANCE_H_

#include "numerics/compare.h"
#include "python/src/status.h"

namespace lockstep {
namespace python {

// Raises lockstep.errors.InvalidArgumentError for a tolerance Validate refuses.
inline numerics::Tolerance ToleranceOf(double atol, double rtol, double relative_l2, bool nan_equal,
                                       bool bitwise) {
  numerics::Tolerance tolerance;
  tolerance.atol = atol;
  tolerance.rtol = rtol;
  tolerance.relative_l2 = relative_l2;
  tolerance.nan_equal = nan_equal;
  tolerance.bitwise = bitwise;
  ThrowIfError(tolerance.Validate());
  return tolerance;
}

// The keyword arguments of a binding taking a tolerance, after its own: pybind11 argument
// annotations with numerics::Tolerance's defaults.
#define LOCKSTEP_TOLERANCE_ARGS(defaults)                                           \
  pybind11::arg("atol") = (defaults).atol, pybind11::arg("rtol") = (defaults).rtol, \
  pybind11::arg("relative_l2") = (defaults).relative_l2,                            \
  pybind11::arg("nan_equal") = (defaults).nan_equal, pybind11::arg("bitwise") = (defaults).bitwise

}  // namespace python
}  // namespace lockstep

#endif  // LOCKSTEP_PYTHON_SRC_TOLERANCE_H_
