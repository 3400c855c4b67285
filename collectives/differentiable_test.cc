// The reference model's differentiable collectives on a thread-fake world: forward values and
// gradients against the same computation done unsplit by hand.

#include "collectives/differentiable.h"

#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "base/status_macros.h"
#include "base/status_testutil.h"
#include "base/torch_boundary.h"
#include "gtest/gtest.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace {

constexpr int kMembers = 3;

// Runs `body(rank, group)` on kMembers threads and expects every one to succeed.
void RunOnMembers(const std::function<absl::Status(int, Communicator&)>& body) {
  collectives::FakeWorld world(kMembers);
  const std::vector<absl::Status> results =
      world.Run([&](Communicator& comm) { return body(comm.rank(), comm); });
  for (int r = 0; r < kMembers; ++r) EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

at::Tensor Input(int rank, int64_t rows) {
  return at::arange(rows * 2, at::kDouble).reshape({rows, 2}) + 10.0 * rank;
}

// f: identity forward; backward sums every member's gradient (here member r's loss weights its
// copy by r + 1, so the summed gradient is 1 + 2 + 3 everywhere).
TEST(DifferentiableCollectivesTest, CopyToGroupSumsTheGradient) {
  RunOnMembers([](int rank, Communicator& group) -> absl::Status {
    at::Tensor x = Input(0, 2).requires_grad_();
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor y, CopyToGroup(x, &group));
    if (!at::equal(y, x)) return absl::InternalError("forward is not the identity");
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward", [&] { (y * (rank + 1.0)).sum().backward(); }));
    if (!at::equal(x.grad(), at::full({2, 2}, 6.0, at::kDouble))) {
      return absl::InternalError("gradient is not the members' sum");
    }
    return absl::OkStatus();
  });
}

// g: sum forward; backward passes the gradient through unchanged.
TEST(DifferentiableCollectivesTest, ReduceFromGroupSumsTheValue) {
  RunOnMembers([](int rank, Communicator& group) -> absl::Status {
    at::Tensor x = Input(rank, 2).requires_grad_();
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor y, ReduceFromGroup(x, &group));
    const at::Tensor expected = Input(0, 2) + Input(1, 2) + Input(2, 2);
    if (!at::equal(y, expected)) return absl::InternalError("forward is not the sum");
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward", [&] { (y * 3.0).sum().backward(); }));
    if (!at::equal(x.grad(), at::full({2, 2}, 3.0, at::kDouble))) {
      return absl::InternalError("gradient was changed");
    }
    return absl::OkStatus();
  });
}

// All-gather of uneven shards (member r holds r rows: one holds none), padded to the widest; the
// gradient of each member's rows collects every member's contribution.
TEST(DifferentiableCollectivesTest, GatherRowsGathersUnevenShardsAndScattersTheGradient) {
  constexpr int64_t kWidest = kMembers - 1;
  RunOnMembers([](int rank, Communicator& group) -> absl::Status {
    at::Tensor x = Input(rank, rank).requires_grad_();
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor all, GatherRows(x, kWidest, &group));
    if (all.size(0) != kMembers * kWidest) return absl::InternalError("wrong gathered rows");
    for (int m = 0; m < kMembers; ++m) {
      at::Tensor block = all.narrow(0, m * kWidest, kWidest);
      if (!at::equal(block.narrow(0, 0, m), Input(m, m)) ||
          !at::equal(block.narrow(0, m, kWidest - m), at::zeros({kWidest - m, 2}, at::kDouble))) {
        return absl::InternalError("member's rows or padding misplaced");
      }
    }
    // Member r's loss weights row i of the gathered tensor by (r + 1) * (i + 1).
    const at::Tensor row_weight =
        (at::arange(kMembers * kWidest, at::kDouble) + 1).unsqueeze(1) * (rank + 1.0);
    LOCKSTEP_RETURN_IF_ERROR(CallTorch("backward", [&] { (all * row_weight).sum().backward(); }));
    // Summed over members: row i's weight is (1 + 2 + 3) * (i + 1) = 6 (i + 1).
    const at::Tensor expected =
        6.0 * (at::arange(rank * kWidest, rank * kWidest + rank, at::kDouble) + 1)
                  .unsqueeze(1)
                  .expand({rank, 2});
    if (x.grad().defined() ? !at::equal(x.grad(), expected) : rank != 0) {
      return absl::InternalError("gradient of the member's rows is not every member's sum");
    }
    return absl::OkStatus();
  });
}

TEST(DifferentiableCollectivesTest, NullGroupIsTheIdentityAndBadShapesAreRefused) {
  at::Tensor x = Input(0, 3);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor copied, CopyToGroup(x, nullptr));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor reduced, ReduceFromGroup(x, nullptr));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor gathered, GatherRows(x, 3, nullptr));
  EXPECT_TRUE(at::equal(copied, x));
  EXPECT_TRUE(at::equal(reduced, x));
  EXPECT_TRUE(at::equal(gathered, x));
  EXPECT_EQ(GatherRows(x, 2, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherRows(at::scalar_tensor(1.0), 2, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Reduce-scatter: member r keeps its rows of the sum; in backward member m's input gradient is
// every member's row gradient in that member's place (member r weights its rows by r + 1; padding
// rows get none).
TEST(DifferentiableCollectivesTest, ReduceScatterRowsKeepsTheOwnRowsOfTheSum) {
  constexpr int64_t kWidest = 2;
  RunOnMembers([](int rank, Communicator& group) -> absl::Status {
    const int64_t rows = rank == 2 ? 1 : 2;  // member 2's shard is short
    at::Tensor x = Input(rank, kMembers * kWidest).requires_grad_();
    LOCKSTEP_ASSIGN_OR_RETURN(at::Tensor mine, ReduceScatterRows(x, rows, kWidest, &group));
    at::Tensor sum = Input(0, kMembers * kWidest);
    for (int r = 1; r < kMembers; ++r) sum = sum + Input(r, kMembers * kWidest);
    if (!at::allclose(mine, sum.narrow(0, rank * kWidest, rows))) {
      return absl::InternalError("forward is not the own rows of the sum");
    }
    LOCKSTEP_RETURN_IF_ERROR(
        CallTorch("backward", [&] { (mine * (rank + 1.0)).sum().backward(); }));
    at::Tensor expected = at::zeros({kMembers * kWidest, 2}, at::kDouble);
    for (int r = 0; r < kMembers; ++r) {
      expected.narrow(0, r * kWidest, r == 2 ? 1 : 2).fill_(r + 1.0);
    }
    if (!at::equal(x.grad(), expected)) return absl::InternalError("backward is wrong");
    return absl::OkStatus();
  });
  EXPECT_EQ(ReduceScatterRows(at::zeros({3, 2}), 1, 2, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A member that fails in backward: the others' backward collective fails too (no hang), and the
// status code survives the exception that carries it.
TEST(DifferentiableCollectivesTest, AFailedBackwardCollectiveIsAStatusEverywhere) {
  collectives::FakeWorld world(kMembers, collectives::FakeWorld::Options::Of(absl::Seconds(2)));
  world.InjectFailure(/*rank=*/1, /*call_index=*/0);
  const std::vector<absl::Status> results = world.Run([](Communicator& group) {
    at::Tensor x = Input(0, 2).requires_grad_();
    absl::StatusOr<at::Tensor> y = CopyToGroup(x, &group);
    if (!y.ok()) return y.status();
    return CallTorch("backward", [&] { y->sum().backward(); });
  });
  // The peers learn of the failed member through their own collective: unavailable, the code
  // the fake gives, carried through backward's exception.
  EXPECT_EQ(results[0].code(), absl::StatusCode::kUnavailable) << results[0];
  EXPECT_EQ(results[2].code(), absl::StatusCode::kUnavailable) << results[2];
  EXPECT_FALSE(results[1].ok());
  EXPECT_NE(results[0].message().find("in CopyToGroup's backward"), absl::string_view::npos)
      << results[0];
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
