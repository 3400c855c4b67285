#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "qualification/internal/checks.h"
#include "rng/philox.h"
#include "rng/rank_streams.h"
#include "rng/snapshot.h"
#include "rng/synchronize.h"

namespace lockstep {
namespace qualification {
using collectives::Communicator;
using collectives::Topology;
using internal::CallerDraws;
using internal::DisagreeWithLeader;
using internal::OnModelStream;
using internal::Ranks;
using internal::Rewind;

absl::StatusOr<CheckResult> CheckReplicaAgreement(RankSetup& setup) {
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  at::Tensor draws;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing", [&] { draws = CallerDraws(); }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, setup.groups.world().AllGather(draws));
  const std::vector<int> bad = DisagreeWithLeader(setup.groups.topology(), all);
  const int leader = setup.groups.replica_leader();
  return CheckResult::Make(
      "replica_agreement", bad.empty(),
      bad.empty() ? absl::StrCat("replicas match leader ", leader)
                  : absl::StrCat(bad.size(), " rank(s) differ from their leader: ", Ranks(bad)));
}

absl::StatusOr<CheckResult> CheckDpWorkersIndependent(RankSetup& setup) {
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  at::Tensor draws;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing", [&] { draws = CallerDraws(); }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> all, setup.groups.world().AllGather(draws));
  const Topology& topo = setup.groups.topology();
  std::vector<int> same;
  for (int d = 1; d < topo.dp_size(); ++d) {
    if (at::equal(all[d * topo.tp_size() * topo.cp_size()], all[0])) same.push_back(d);
  }
  return CheckResult::Make(
      "dp_workers_independent", same.empty(),
      topo.dp_size() == 1 ? "one DP worker"
      : same.empty()      ? absl::StrCat(topo.dp_size(), " DP workers all differ")
                     : absl::StrCat("DP worker(s) ", Ranks(same), " draw what DP worker 0 draws"));
}

absl::StatusOr<CheckResult> CheckModelStream(RankSetup& setup) {
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  at::Tensor caller_expected;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("drawing", [&] { caller_expected = at::rand({8}); }));
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  // A fresh model stream, derived from the synchronized caller state.
  LOCKSTEP_RETURN_IF_ERROR(setup.streams->model().Restore(std::nullopt));
  at::Tensor first, second;
  LOCKSTEP_RETURN_IF_ERROR(
      OnModelStream(setup, [&] { first = at::dropout(at::ones({128}), 0.3, true); }));
  LOCKSTEP_RETURN_IF_ERROR(
      OnModelStream(setup, [&] { second = at::dropout(at::ones({128}), 0.3, true); }));
  bool caller_ok = false;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("drawing", [&] { caller_ok = at::equal(at::rand({8}), caller_expected); }));
  const bool advanced = !at::equal(first, second);
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> masks, setup.groups.world().AllGather(first));
  const std::vector<int> bad = DisagreeWithLeader(setup.groups.topology(), masks);
  return CheckResult::Make(
      "model_stream", caller_ok && advanced && bad.empty(),
      absl::StrCat(
          "caller ", caller_ok ? "untouched" : "DISTURBED", "; stream ",
          advanced ? "advances" : "REPLAYS", "; ",
          bad.empty() ? "replica masks agree" : absl::StrCat(bad.size(), " replica(s) differ")));
}

namespace {

// A model-stream scope as the exception check holds it. Under the no-restore-on-unwind control,
// a scope left without Exit (by unwinding or an early error return) is never closed: the bug of a
// scope that restores the caller only on the normal path.
class HeldScope {
 public:
  HeldScope(std::optional<rng::ModelStreamScope> scope, bool leak_unless_exited)
      : scope_(std::move(scope)), leak_(leak_unless_exited) {}
  ~HeldScope() {
    if (leak_ && scope_.has_value()) new rng::ModelStreamScope(std::move(*scope_));  // never undone
  }
  absl::Status Exit() {
    absl::Status status = scope_.has_value() ? scope_->Exit() : absl::OkStatus();
    scope_.reset();
    return status;
  }

 private:
  std::optional<rng::ModelStreamScope> scope_;
  bool leak_;
};

}  // namespace

// Model work that fails inside a live model-stream scope, which is then left by unwinding, not by
// Exit: a C++ exception thrown through the scope (its destructor restores the caller), and the
// library's own failure path (an error status returned from inside the scope). Each must leave
// the caller's state bit-exact — the CPU generator and, with --device=cuda, the rank's CUDA
// generator. The check uses streams of its own, so that a control that leaks its scope leaves
// the rank's streams usable.
absl::StatusOr<CheckResult> CheckExceptionRestoration(RankSetup& setup) {
  const bool cuda = setup.device == "cuda";
  rng::DefaultGenerators generators = rng::DefaultGenerators::CpuOnly();
  if (cuda) {
    if (!at::hasCUDA() || at::getNumGPUs() == 0) {
      return absl::FailedPreconditionError(
          "--device cuda: no CUDA device in this build or machine");
    }
    generators =
        rng::DefaultGenerators::WithCudaDevice(setup.groups.world().rank() % at::getNumGPUs());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(std::shared_ptr<rng::RankStreams> streams,
                            rng::RankStreams::Create(generators));
  const bool leak = setup.control == NegativeControl::kNoRestoreOnUnwind;
  std::vector<std::string> broken;
  for (const bool exception : {true, false}) {
    LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot before, rng::RngSnapshot::Capture(generators));
    const absl::Status left = [&]() -> absl::Status {
      try {
        std::optional<rng::ModelStreamScope> entered;
        if (setup.control != NegativeControl::kUnscopedModelWork) {
          absl::StatusOr<rng::ModelStreamScope> scope = rng::ModelStreamScope::Enter(*streams);
          if (!scope.ok()) return scope.status();
          entered.emplace(*std::move(scope));
        }
        HeldScope scope(std::move(entered), leak);
        (void)at::rand({100});
        if (cuda)
          (void)at::rand({100}, at::TensorOptions().device(at::kCUDA, generators.cuda_device));
        if (exception) throw std::runtime_error("injected: thrown through the scope");
        return absl::InternalError("injected: an error returned from inside the scope");
      } catch (const std::runtime_error&) {
        return absl::AbortedError("unwound");
      }
    }();
    if (left.ok()) return absl::InternalError("the injected failure was not reported");
    LOCKSTEP_ASSIGN_OR_RETURN(rng::RngSnapshot now, rng::RngSnapshot::Capture(generators));
    if (!(now == before)) {
      broken.push_back(exception ? "an exception thrown through the scope"
                                 : "an error returned from inside the scope");
    }
  }
  LOCKSTEP_RETURN_IF_ERROR(Rewind(setup));
  const std::string generators_text = cuda ? "CPU and CUDA generators" : "CPU generator";
  return CheckResult::Make(
      "exception_restoration", broken.empty(),
      broken.empty()
          ? absl::StrCat("caller state bit-exact (", generators_text,
                         ") after an exception thrown through the model-stream scope and after "
                         "an error returned from inside it")
          : absl::StrCat(absl::StrJoin(broken, " and "), " left the caller's ", generators_text,
                         " changed"));
}

absl::StatusOr<CheckResult> CheckPartitionInvariance(RankSetup& setup) {
  const Topology& topo = setup.groups.topology();
  const collectives::Coordinates c = setup.groups.coordinates();
  const int64_t chunk = 3;
  const int64_t tokens = 2 * topo.cp_size() * chunk, cols_per_tp = 5;
  const std::vector<int64_t> shape = {tokens, cols_per_tp * topo.tp_size()};
  const rng::PhiloxKey key{20261129, /*stream=*/1, /*step=*/7};
  auto shard_box = [&](int cp_rank, int tp_rank, int half) {
    const int64_t chunk_index = half == 0 ? cp_rank : 2 * topo.cp_size() - 1 - cp_rank;
    return std::vector<rng::Slice>{{chunk_index * chunk, (chunk_index + 1) * chunk},
                                   {tp_rank * cols_per_tp, (tp_rank + 1) * cols_per_tp}};
  };
  const c10::Device cpu(c10::kCPU);
  // Each rank's two chunks; the shard-local control draws them with local indices, as if each
  // chunk were the whole tensor.
  auto draw = [&](int half) -> absl::StatusOr<at::Tensor> {
    if (setup.control == NegativeControl::kShardLocalPhilox) {
      return rng::PartitionedDropoutMask(key, {chunk, cols_per_tp}, {{0, chunk}, {0, cols_per_tp}},
                                         0.2, cpu);
    }
    return rng::PartitionedDropoutMask(key, shape, shard_box(c.cp, c.tp, half), 0.2, cpu);
  };
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor a, draw(0));
  LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor b, draw(1));
  Communicator& group = *setup.groups.tp_cp();
  at::Tensor mine;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("joining the shards", [&] {
    mine = at::cat({a, b}, 0).to(at::kByte);
  }));
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<at::Tensor> shards, group.AllGather(mine));
  at::Tensor assembled;
  LOCKSTEP_RETURN_IF_ERROR(
      CallTorch("allocating", [&] { assembled = at::zeros(shape, at::kByte); }));
  for (int m = 0; m < group.size(); ++m) {
    LOCKSTEP_ASSIGN_OR_RETURN(collectives::Coordinates mc,
                              topo.CoordinatesOf(group.global_ranks()[m]));
    for (int half = 0; half < 2; ++half) {
      const auto box = shard_box(mc.cp, mc.tp, half);
      LOCKSTEP_RETURN_IF_ERROR(CallTorch("reassembling", [&] {
        assembled.slice(0, box[0].begin, box[0].end)
            .slice(1, box[1].begin, box[1].end)
            .copy_(shards[m].slice(0, half * chunk, (half + 1) * chunk));
      }));
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      at::Tensor full,
      rng::PartitionedDropoutMask(key, shape, {{0, shape[0]}, {0, shape[1]}}, 0.2, cpu));
  const bool equal = at::equal(assembled, full.to(at::kByte));
  return CheckResult::Make(
      "partition_invariance", equal,
      absl::StrCat(group.size(), " shard(s) of a [", shape[0], ", ", shape[1], "] mask ",
                   equal ? "reassemble" : "DO NOT reassemble", " to the unsharded mask"));
}

}  // namespace qualification
}  // namespace lockstep
