#include "testing/fake_communicator.h"

#include <optional>
#include <thread>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace collectives {

struct FakeWorld::Call {
  std::string op;         // "broadcast", "all_gather", "all_reduce_sum", "barrier"
  std::string signature;  // op with its arguments; members must agree on it
  at::Tensor tensor;      // the caller's tensor (aliased: broadcast/all-reduce write into it)
  int root = 0;
};

struct FakeWorld::Slot {
  explicit Slot(size_t n) : arrivals(n) {}
  std::vector<std::optional<Call>> arrivals;
  int arrived = 0;
  int finished = 0;  // members that have left the slot (with a result or an error)
  bool done = false;
  absl::Status failure;
  std::vector<at::Tensor> results;
};

struct FakeWorld::Fault {
  enum Kind { kFail, kDelay, kSubstitute } kind;
  absl::Duration delay;
  std::function<absl::Status(collectives::Communicator&)> substitute;
};

namespace {

std::string DescribeTensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(std::string(c10::toString(t.scalar_type())), "[",
                      absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace

class FakeCommunicator : public internal::CommunicatorBase {
 public:
  FakeCommunicator(FakeWorld* world, std::shared_ptr<internal::WorldState> state,
                   internal::GroupIdentity identity)
      : CommunicatorBase(std::move(state), std::move(identity)), world_(world) {}

  absl::Status Broadcast(at::Tensor& tensor, int root) override {
    const std::string op = absl::StrCat("broadcast from group rank ", root);
    return Collective(op, [&]() -> absl::Status {
      if (root < 0 || root >= size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(What(op), ": root is outside [0, ", size(), ")"));
      }
      FakeWorld::Call call{"broadcast",
                           absl::StrCat("broadcast(root=", root, ", ", DescribeTensor(tensor), ")"),
                           tensor, root};
      return Run(std::move(call), nullptr);
    });
  }

  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& input) override {
    std::vector<at::Tensor> outputs;
    absl::Status status = Collective("all-gather", [&] {
      FakeWorld::Call call{"all_gather", absl::StrCat("all_gather(", DescribeTensor(input), ")"),
                           input, 0};
      return Run(std::move(call), &outputs);
    });
    if (!status.ok()) return status;
    return outputs;
  }

  absl::Status AllReduceSum(at::Tensor& tensor) override {
    return Collective("all-reduce (sum)", [&] {
      FakeWorld::Call call{"all_reduce_sum",
                           absl::StrCat("all_reduce_sum(", DescribeTensor(tensor), ")"), tensor, 0};
      return Run(std::move(call), nullptr);
    });
  }

  absl::Status Barrier() override {
    return Collective("barrier", [&] {
      return Run(FakeWorld::Call{"barrier", "barrier()", {}, 0}, nullptr);
    });
  }

 private:
  absl::StatusOr<std::unique_ptr<Communicator>> CreateGroup(
      internal::GroupIdentity identity) override {
    return std::unique_ptr<Communicator>(
        new FakeCommunicator(world_, world_state(), std::move(identity)));
  }

  absl::Status Run(FakeWorld::Call call, std::vector<at::Tensor>* outputs) {
    bool substituted = false;
    std::function<absl::Status(Communicator&)> substitute;
    const int global_rank = global_ranks()[rank()];
    absl::Status fault = world_->ApplyFaults(global_rank, &substituted, &substitute);
    if (!fault.ok()) return fault;
    if (substituted) return substitute(*this);
    return world_->Collective(global_ranks(), rank(), std::move(call), outputs);
  }

  FakeWorld* world_;
};

FakeWorld::FakeWorld(int world_size, Options options)
    : world_size_(world_size),
      options_(options),
      calls_made_(world_size, 0),
      dead_(world_size, false),
      state_(std::make_shared<internal::WorldState>("fake", world_size, options.timeout)) {
  LOCKSTEP_CHECK(world_size > 0) << "a fake world needs at least one rank, not " << world_size;
}

std::unique_ptr<collectives::Communicator> FakeWorld::Communicator(int rank) {
  LOCKSTEP_CHECK(rank >= 0 && rank < world_size_) << "rank " << rank << " of " << world_size_;
  return std::make_unique<FakeCommunicator>(this, state_,
                                            internal::GroupIdentity::World(*state_, rank));
}

void FakeWorld::InjectFailure(int rank, int call_index) {
  absl::MutexLock lock(&mu_);
  faults_.emplace(std::make_pair(rank, call_index),
                  std::make_shared<Fault>(Fault{Fault::kFail, absl::ZeroDuration(), nullptr}));
}

void FakeWorld::InjectDelay(int rank, int call_index, absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  faults_.emplace(std::make_pair(rank, call_index),
                  std::make_shared<Fault>(Fault{Fault::kDelay, delay, nullptr}));
}

void FakeWorld::InjectSubstitute(
    int rank, int call_index, std::function<absl::Status(collectives::Communicator&)> substitute) {
  absl::MutexLock lock(&mu_);
  faults_.emplace(std::make_pair(rank, call_index),
                  std::make_shared<Fault>(
                      Fault{Fault::kSubstitute, absl::ZeroDuration(), std::move(substitute)}));
}

int FakeWorld::completed_collectives() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

absl::Status FakeWorld::ApplyFaults(
    int global_rank, bool* substituted,
    std::function<absl::Status(collectives::Communicator&)>* substitute) {
  absl::Duration delay = absl::ZeroDuration();
  {
    absl::MutexLock lock(&mu_);
    const int index = calls_made_[global_rank]++;
    if (dead_[global_rank]) {
      return absl::AbortedError(absl::StrCat("rank ", global_rank, " has failed"));
    }
    auto range = faults_.equal_range({global_rank, index});
    for (auto it = range.first; it != range.second; ++it) {
      const Fault& fault = *it->second;
      switch (fault.kind) {
        case Fault::kFail:
          dead_[global_rank] = true;
          return absl::AbortedError(absl::StrCat("injected failure of rank ", global_rank,
                                                 " at its collective call ", index));
        case Fault::kDelay:
          delay += fault.delay;
          break;
        case Fault::kSubstitute:
          *substituted = true;
          *substitute = fault.substitute;
          break;
      }
    }
  }
  absl::SleepFor(delay);
  return absl::OkStatus();
}

absl::Status FakeWorld::Collective(const std::vector<int>& group, int member, Call call,
                                   std::vector<at::Tensor>* outputs) {
  const int n = static_cast<int>(group.size());
  absl::MutexLock lock(&mu_);
  std::vector<int64_t>& next = next_call_[group];
  if (next.empty()) next.assign(n, 0);
  const int64_t seq = next[member]++;
  const auto key = std::make_pair(group, seq);
  std::shared_ptr<Slot>& slot_ref = slots_[key];
  if (!slot_ref) slot_ref = std::make_shared<Slot>(n);
  std::shared_ptr<Slot> slot = slot_ref;
  const std::string where =
      absl::StrCat(call.op, " (call ", seq, " on group ", FormatRanks(group), ")");

  auto leave = [&](absl::Status status) {
    if (++slot->finished == n) slots_.erase(key);
    return status;
  };

  if (!slot->done) {
    // Members must agree on the operation and its arguments.
    for (int m = 0; m < n; ++m) {
      const std::optional<Call>& other = slot->arrivals[m];
      if (other.has_value() && other->signature != call.signature) {
        std::vector<std::string> parts;
        for (int k = 0; k < n; ++k) {
          if (k == member) {
            parts.push_back(absl::StrCat("rank ", group[k], " called ", call.signature));
          } else if (slot->arrivals[k].has_value()) {
            parts.push_back(
                absl::StrCat("rank ", group[k], " called ", slot->arrivals[k]->signature));
          }
        }
        slot->failure = absl::FailedPreconditionError(
            absl::StrCat("mismatched collectives at call ", seq, " on group ", FormatRanks(group),
                         ": ", absl::StrJoin(parts, "; ")));
        slot->done = true;
        break;
      }
    }
  }
  if (slot->done) return leave(slot->failure);

  slot->arrivals[member] = call;
  if (++slot->arrived == n) {
    absl::Status computed = CallTorch(absl::StrCat("while computing ", where), [&] {
      if (call.op == "broadcast") {
        slot->results = {slot->arrivals[call.root]->tensor.clone()};
      } else if (call.op == "all_gather") {
        for (int m = 0; m < n; ++m) slot->results.push_back(slot->arrivals[m]->tensor.clone());
      } else if (call.op == "all_reduce_sum") {
        at::Tensor sum = slot->arrivals[0]->tensor.clone();
        for (int m = 1; m < n; ++m) sum.add_(slot->arrivals[m]->tensor);
        slot->results = {sum};
      }
    });
    slot->failure = computed;
    slot->done = true;
    if (computed.ok()) ++completed_;
  }

  auto finished_or_peer_dead = [&]() {
    mu_.AssertReaderHeld();
    if (slot->done) return true;
    for (int m = 0; m < n; ++m)
      if (!slot->arrivals[m].has_value() && dead_[group[m]]) return true;
    return false;
  };
  const absl::Time deadline = absl::Now() + options_.timeout;
  mu_.AwaitWithDeadline(absl::Condition(&finished_or_peer_dead), deadline);

  if (!slot->done) {
    std::vector<int> missing, dead;
    for (int m = 0; m < n; ++m) {
      if (slot->arrivals[m].has_value()) continue;
      (dead_[group[m]] ? dead : missing).push_back(group[m]);
    }
    if (!dead.empty()) {
      return leave(absl::UnavailableError(
          absl::StrCat(where, ": rank(s) ", FormatRanks(dead), " failed before joining")));
    }
    return leave(absl::DeadlineExceededError(
        absl::StrCat(where, " timed out after ", absl::FormatDuration(options_.timeout),
                     ": rank(s) ", FormatRanks(missing), " did not arrive")));
  }
  if (!slot->failure.ok()) return leave(slot->failure);

  absl::Status copied = CallTorch(absl::StrCat("while delivering ", where), [&] {
    if (call.op == "broadcast" || call.op == "all_reduce_sum") {
      if (!(call.op == "broadcast" && member == call.root)) call.tensor.copy_(slot->results[0]);
    } else if (call.op == "all_gather") {
      outputs->clear();
      for (const at::Tensor& t : slot->results) outputs->push_back(t.clone());
    }
  });
  return leave(copied);
}

std::vector<absl::Status> FakeWorld::Run(
    std::function<absl::Status(collectives::Communicator&)> body) {
  std::vector<absl::Status> results(world_size_);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size_; ++r) {
    threads.emplace_back([this, r, &body, &results] {
      std::unique_ptr<collectives::Communicator> comm = Communicator(r);
      results[r] = CallTorch(absl::StrCat("rank ", r), [&] { return body(*comm); });
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace collectives
}  // namespace lockstep
