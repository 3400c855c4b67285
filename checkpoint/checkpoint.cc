#include "checkpoint/checkpoint.h"

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "ATen/Context.h"
#include "ATen/detail/CUDAHooksInterface.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "rng/generators.h"
#include "rng/rank_streams.h"
#include "torch/csrc/autograd/autograd.h"
#include "torch/csrc/autograd/function.h"
#include "torch/csrc/autograd/functions/utils.h"
#include "torch/csrc/autograd/grad_mode.h"
#include "torch/csrc/autograd/saved_variable.h"

namespace lockstep {
namespace checkpoint {
namespace {

std::atomic<int64_t> live_nodes{0};

// The default generators are process-wide, and one backward may run checkpoint nodes on the
// calling thread (CPU) and on device threads (CUDA) at once: only one recompute at a time may
// hold them rewound. Held from saving the live state until it is restored, not during the
// inner backward (nested checkpoints take it in turn).
std::mutex& RewindMutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::atomic<int64_t> live_rng_bytes{0};

// The forward's saved stream values, counted while alive.
class RetainedRng {
 public:
  explicit RetainedRng(std::unique_ptr<SavedRngState> saved)
      : saved_(std::move(saved)), bytes_(static_cast<int64_t>(saved_->ByteSize())) {
    live_nodes.fetch_add(1);
    live_rng_bytes.fetch_add(bytes_);
  }
  ~RetainedRng() {
    live_nodes.fetch_sub(1);
    live_rng_bytes.fetch_sub(bytes_);
  }
  RetainedRng(const RetainedRng&) = delete;
  RetainedRng& operator=(const RetainedRng&) = delete;

  const SavedRngState& saved() const { return *saved_; }

 private:
  std::unique_ptr<SavedRngState> saved_;
  int64_t bytes_;
};

bool IsDifferentiable(const at::Tensor& t) {
  return t.defined() && (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()));
}

// Backward can only report by throwing. The exception's type carries the status's code, so that
// the caller's CallTorch (base/torch_boundary.h) maps it back: out of memory stays
// kResourceExhausted (admission recovers from it), bad input stays kInvalidArgument.
[[noreturn]] void Fail(const absl::Status& status) {
  ThrowAsTorchError(Annotate(status, "in lockstep::Checkpoint's backward"));
}

// Puts the live stream values back when the recompute leaves, by return or by exception.
class LiveRestorer {
 public:
  explicit LiveRestorer(const SavedRngState& live) : live_(live) {}
  ~LiveRestorer() {
    if (done_) return;
    if (absl::Status s = live_.Restore(); !s.ok()) {
      LOCKSTEP_LOG(ERROR) << "lockstep::Checkpoint: restoring the live RNG streams after a "
                          << "failed recompute: " << s;
    }
  }
  absl::Status RestoreNow() {
    absl::Status restored = live_.Restore();
    done_ = restored.ok();  // on failure the destructor tries once more
    return restored;
  }

 private:
  const SavedRngState& live_;
  bool done_ = false;
};

class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(CheckpointedFunction fn, std::shared_ptr<const RngStateSaver> saver,
                     std::unique_ptr<SavedRngState> forward_rng,
                     const std::vector<at::Tensor>& inputs)
      : fn_(std::move(fn)),
        saver_(std::move(saver)),
        forward_rng_(std::make_unique<RetainedRng>(std::move(forward_rng))) {
    for (const at::Tensor& input : inputs) {
      saved_inputs_.emplace_back(input, /*is_output=*/false);
      input_needs_grad_.push_back(input.defined() && input.requires_grad());
    }
  }

  std::string name() const override { return "lockstep::CheckpointBackward"; }

  // Which forward output each of this node's gradient slots belongs to.
  void AddOutput(size_t index) { output_index_.push_back(index); }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    forward_rng_.reset();
    saved_inputs_.clear();
    fn_ = nullptr;
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "lockstep::Checkpoint backward: create_graph=true (higher-order gradients) is not "
                "supported; the gradients it returns would carry no history");
    if (forward_rng_ == nullptr) {
      TORCH_CHECK(false,
                  "lockstep::Checkpoint backward: this checkpoint's saved RNG state and inputs "
                  "were released by an earlier backward through it; to run backward through it "
                  "more than once, pass retain_graph=true to the earlier backward");
    }
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved_inputs_.size());
    for (auto& saved : saved_inputs_) inputs.push_back(saved.unpack());

    std::vector<at::Tensor> detached;
    std::vector<at::Tensor> outputs;
    {
      std::lock_guard<std::mutex> rewind(RewindMutex());
      absl::StatusOr<std::unique_ptr<SavedRngState>> live = saver_->Save();
      if (!live.ok()) Fail(Annotate(live.status(), "saving the live RNG streams"));
      LiveRestorer restorer(**live);
      if (absl::Status s = forward_rng_->saved().Restore(); !s.ok()) {
        Fail(Annotate(s, "rewinding the RNG streams to the forward pass"));
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        at::Tensor d = inputs[i].defined() ? inputs[i].detach() : inputs[i];
        if (input_needs_grad_[i]) d.requires_grad_(true);
        detached.push_back(std::move(d));
      }
      {
        at::AutoGradMode enable_grad(true);
        outputs = fn_(detached);
      }
      if (absl::Status s = restorer.RestoreNow(); !s.ok()) {
        Fail(Annotate(s, "restoring the live RNG streams after recompute"));
      }
    }

    std::vector<at::Tensor> roots, root_grads;
    for (size_t slot = 0; slot < output_index_.size(); ++slot) {
      const size_t index = output_index_[slot];
      TORCH_CHECK(index < outputs.size(), "lockstep::Checkpoint backward: the recompute returned ",
                  outputs.size(), " outputs, the forward returned more than ", index,
                  "; the checkpointed function must be deterministic in its structure");
      if (!grads[slot].defined() || !outputs[index].requires_grad()) continue;
      roots.push_back(outputs[index]);
      root_grads.push_back(grads[slot]);
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);

    torch::autograd::variable_list input_grads(detached.size());
    for (size_t i = 0; i < detached.size(); ++i) {
      if (input_needs_grad_[i]) input_grads[i] = detached[i].grad();
    }
    return input_grads;
  }

 private:
  std::mutex state_mutex_;  // apply vs release_variables
  CheckpointedFunction fn_;
  std::shared_ptr<const RngStateSaver> saver_;
  std::unique_ptr<RetainedRng> forward_rng_;
  std::vector<torch::autograd::SavedVariable> saved_inputs_;
  std::vector<bool> input_needs_grad_;
  std::vector<size_t> output_index_;
};

// The default generators `fn` may draw from (CPU, and the CUDA device of the inputs or the
// current one), in streams of their own: no named streams are saved.
absl::StatusOr<std::shared_ptr<const RngStateSaver>> DefaultSaver(
    const std::vector<at::Tensor>& inputs) {
  rng::DefaultGenerators generators = rng::DefaultGenerators::CpuOnly();
  for (const at::Tensor& input : inputs) {
    if (input.defined() && input.is_cuda()) {
      generators = rng::DefaultGenerators::WithCudaDevice(input.get_device());
      break;
    }
  }
  // No CUDA input, but `fn` may still draw on the current device (e.g. it creates CUDA tensors).
  if (!generators.has_cuda() && rng::internal::CudaGeneratorsLinked() && at::hasCUDA()) {
    generators = rng::DefaultGenerators::WithCudaDevice(
        static_cast<int>(at::detail::getCUDAHooks().current_device()));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<rng::RankStreams> streams,
                            rng::RankStreams::Create(generators));
  return std::shared_ptr<const RngStateSaver>(StreamSnapshots::Of(std::move(streams)));
}

bool AliasesAny(const at::Tensor& output, const std::vector<at::Tensor>& tensors, size_t count) {
  for (size_t i = 0; i < count && i < tensors.size(); ++i) {
    if (tensors[i].defined() && output.is_alias_of(tensors[i])) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::vector<at::Tensor>> Checkpoint(const CheckpointedFunction& fn,
                                                   const std::vector<at::Tensor>& inputs,
                                                   const CheckpointOptions& options) {
  if (!fn) return absl::InvalidArgumentError("Checkpoint: the function is empty");
  if (!at::GradMode::is_enabled()) {
    return CallTorch("running a checkpointed function without grad",
                     [&]() -> absl::StatusOr<std::vector<at::Tensor>> { return fn(inputs); });
  }
  std::shared_ptr<const RngStateSaver> saver = options.rng_streams;
  if (saver == nullptr) {
    absl::StatusOr<std::shared_ptr<const RngStateSaver>> fallback = DefaultSaver(inputs);
    if (!fallback.ok()) return Annotate(fallback.status(), "Checkpoint: the default RNG saver");
    saver = *std::move(fallback);
  }
  absl::StatusOr<std::unique_ptr<SavedRngState>> forward_rng = saver->Save();
  if (!forward_rng.ok()) {
    return Annotate(forward_rng.status(), "Checkpoint: saving the RNG streams for recompute");
  }
  std::vector<at::Tensor> outputs;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("Checkpoint: running the checkpointed function", [&] {
    at::NoGradGuard no_grad;
    outputs = fn(inputs);
  }));
  LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT((*forward_rng)->CheckReplayable(), "Checkpoint");

  LOCKSTEP_RETURN_IF_ERROR(CallTorch("Checkpoint: attaching the outputs to autograd", [&] {
    std::shared_ptr<CheckpointBackward> node(
        new CheckpointBackward(fn, saver, std::move(*forward_rng), inputs),
        torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(inputs));
    for (size_t i = 0; i < outputs.size(); ++i) {
      at::Tensor& output = outputs[i];
      if (!IsDifferentiable(output)) continue;
      // History cannot be attached to a view, to an input itself, twice to one tensor, or to a
      // tensor `fn` did not create under no-grad (a captured parameter returned as is); a copy
      // can take it.
      if (output.is_view() || output.requires_grad() || AliasesAny(output, inputs, inputs.size()) ||
          AliasesAny(output, outputs, i)) {
        at::NoGradGuard no_grad;
        output = output.clone();
      }
      node->AddOutput(i);
      torch::autograd::create_gradient_edge(output, node);
    }
  }));
  return outputs;
}

RetainedCheckpointState RetainedState() {
  return RetainedCheckpointState{live_nodes.load(), live_rng_bytes.load()};
}

}  // namespace checkpoint
}  // namespace lockstep
