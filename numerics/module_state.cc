#include "numerics/module_state.h"

#include <map>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "torch/torch.h"
#include "torch/version.h"

namespace lockstep {
namespace numerics {
namespace {

void AddIfDefined(NamedTensors& out, const std::string& prefix, const char* field,
                  const at::Tensor& tensor) {
  if (tensor.defined()) out.emplace_back(absl::StrCat(prefix, "/", field), tensor);
}

void AddStep(NamedTensors& out, const std::string& prefix, int64_t step) {
  out.emplace_back(absl::StrCat(prefix, "/step"), at::scalar_tensor(step, at::kLong));
}

// The fields of one parameter's state; false for a state type this file does not know.
bool AddParamState(NamedTensors& out, const std::string& prefix,
                   const torch::optim::OptimizerParamState& state) {
  if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    AddStep(out, prefix, adam->step());
    AddIfDefined(out, prefix, "exp_avg", adam->exp_avg());
    AddIfDefined(out, prefix, "exp_avg_sq", adam->exp_avg_sq());
    AddIfDefined(out, prefix, "max_exp_avg_sq", adam->max_exp_avg_sq());
  } else if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    AddStep(out, prefix, adamw->step());
    AddIfDefined(out, prefix, "exp_avg", adamw->exp_avg());
    AddIfDefined(out, prefix, "exp_avg_sq", adamw->exp_avg_sq());
    AddIfDefined(out, prefix, "max_exp_avg_sq", adamw->max_exp_avg_sq());
  } else if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    AddIfDefined(out, prefix, "momentum_buffer", sgd->momentum_buffer());
  } else if (auto* adagrad = dynamic_cast<const torch::optim::AdagradParamState*>(&state)) {
    AddStep(out, prefix, adagrad->step());
    AddIfDefined(out, prefix, "sum", adagrad->sum());
  } else if (auto* rms = dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    AddStep(out, prefix, rms->step());
    AddIfDefined(out, prefix, "square_avg", rms->square_avg());
    AddIfDefined(out, prefix, "momentum_buffer", rms->momentum_buffer());
    AddIfDefined(out, prefix, "grad_avg", rms->grad_avg());
  } else {
    return false;
  }
  return true;
}

// The optimizer's key for a parameter's state: its TensorImpl's address, as a string before
// LibTorch 2 and as a pointer since.
#if TORCH_VERSION_MAJOR >= 2
void* StateKey(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
std::string StateKey(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }
#endif

absl::Status AppendOptimizerState(const std::map<const void*, std::string>& path_of,
                                  const torch::optim::Optimizer& optimizer, NamedTensors& out) {
  const auto& states = optimizer.state();
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto found = states.find(StateKey(params[i]));
      if (found == states.end()) continue;  // no step taken for it yet
      auto path = path_of.find(params[i].unsafeGetTensorImpl());
      const std::string prefix = path != path_of.end()
                                     ? absl::StrCat("optimizer/", path->second)
                                     : absl::StrCat("optimizer/group", g, "/param", i);
      const torch::optim::OptimizerParamState& state = *found->second;
      if (!AddParamState(out, prefix, state)) {
        return absl::UnimplementedError(
            absl::StrCat("the optimizer state of ", prefix, " is a ", typeid(state).name(),
                         "; inventories know Adam, AdamW, SGD, Adagrad and RMSprop states"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NamedTensors> ModuleState(const torch::nn::Module& module,
                                         const torch::optim::Optimizer* optimizer) {
  NamedTensors out;
  std::map<const void*, std::string> path_of;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
    path_of[item.value().unsafeGetTensorImpl()] = item.key();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  if (optimizer == nullptr) return out;
  if (absl::Status s = AppendOptimizerState(path_of, *optimizer, out); !s.ok()) return s;
  return out;
}

absl::StatusOr<NamedTensors> OptimizerState(const NamedTensors& parameters,
                                            const torch::optim::Optimizer& optimizer) {
  NamedTensors out;
  std::map<const void*, std::string> path_of;
  for (const auto& [name, tensor] : parameters) path_of[tensor.unsafeGetTensorImpl()] = name;
  if (absl::Status s = AppendOptimizerState(path_of, optimizer, out); !s.ok()) return s;
  return out;
}

}  // namespace numerics
}  // namespace lockstep
