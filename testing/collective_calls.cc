#include "testing/collective_calls.h"

#include "ATen/ATen.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace collectives {
namespace {

// A message-like object for BroadcastObject.
struct Message {
  std::string text;
  std::string SerializeAsString() const { return text; }
  bool ParseFromString(const std::string& bytes) {
    text = bytes;
    return true;
  }
};

}  // namespace

std::vector<CollectiveCall> AllCollectiveCalls() {
  return {CollectiveCall::kBroadcast, CollectiveCall::kAllGather, CollectiveCall::kAllReduce,
          CollectiveCall::kBarrier,   CollectiveCall::kBytes,     CollectiveCall::kObject};
}

std::string CollectiveCallName(CollectiveCall call) {
  switch (call) {
    case CollectiveCall::kBroadcast:
      return "broadcast";
    case CollectiveCall::kAllGather:
      return "all-gather";
    case CollectiveCall::kAllReduce:
      return "all-reduce";
    case CollectiveCall::kBarrier:
      return "barrier";
    case CollectiveCall::kBytes:
      return "bytes broadcast";
    case CollectiveCall::kObject:
      return "object broadcast";
  }
  return "?";
}

absl::Status RunCollectiveCall(CollectiveCall call, Communicator& comm, c10::Device device) {
  at::Tensor t;
  absl::Status made = CallTorch("making the tensor", [&] {
    t = at::full({4}, static_cast<double>(comm.rank()), at::TensorOptions().device(device));
  });
  if (!made.ok()) return made;
  switch (call) {
    case CollectiveCall::kBroadcast:
      return comm.Broadcast(t, 0);
    case CollectiveCall::kAllGather:
      return comm.AllGather(t).status();
    case CollectiveCall::kAllReduce:
      return comm.AllReduceSum(t);
    case CollectiveCall::kBarrier:
      return comm.Barrier();
    case CollectiveCall::kBytes: {
      std::string bytes = comm.rank() == 0 ? "the root's bytes" : "";
      return BroadcastBytes(comm, &bytes, 0);
    }
    case CollectiveCall::kObject: {
      Message message{comm.rank() == 0 ? "the root's object" : ""};
      return BroadcastObject(comm, &message, 0);
    }
  }
  return absl::InternalError("unknown collective");
}

}  // namespace collectives
}  // namespace lockstep
