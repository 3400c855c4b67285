// numerics/module_state.h
//
// The tensors of a LibTorch module and its optimizer as one named set, for inventories and
// comparisons: parameters and buffers under their module paths ("encoder.0.weight"), and each
// parameter's optimizer state as "optimizer/<parameter path>/<field>" (a parameter the module
// does not hold is "optimizer/group<g>/param<i>/<field>"). Fields: Adam and AdamW step, exp_avg,
// exp_avg_sq and max_exp_avg_sq; SGD momentum_buffer; Adagrad step and sum; RMSprop step,
// square_avg, momentum_buffer and grad_avg (undefined ones are absent); a step is a 0-d int64
// tensor. The tensors alias the live ones: inventory or compare them before training continues.
//
// Thread-safety: reads the module and optimizer; the caller keeps them still meanwhile.

#ifndef LOCKSTEP_NUMERICS_MODULE_STATE_H_
#define LOCKSTEP_NUMERICS_MODULE_STATE_H_

#include "absl/status/statusor.h"
#include "numerics/named_tensors.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace lockstep {
namespace numerics {

// The set described above. kUnimplemented naming the type for an optimizer whose per-parameter
// state is none of the listed kinds.
absl::StatusOr<NamedTensors> ModuleState(const torch::nn::Module& module,
                                         const torch::optim::Optimizer* optimizer = nullptr);

// The optimizer part of that set for parameters that are not a module's: each parameter of
// `optimizer` found in `parameters` (by identity) under its name there, the others as
// "optimizer/group<g>/param<i>/<field>". The same error for an unknown state kind.
absl::StatusOr<NamedTensors> OptimizerState(const NamedTensors& parameters,
                                            const torch::optim::Optimizer& optimizer);

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_MODULE_STATE_H_
