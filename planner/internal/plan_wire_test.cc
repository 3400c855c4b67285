#include "planner/internal/plan_wire.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "base/sha256_message.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "planner/planner_testutil.h"

namespace lockstep {
namespace planner {
namespace {

// The oracle: protobuf's own deterministic serialization.
std::string ProtobufBytes(const Plan& plan) { return SerializeDeterministically(plan); }

Sha256Digest ProtobufDigest(const Plan& plan) {
  Sha256Hasher hasher;
  hasher.AppendFramed(kPlanDigestTag);
  AppendMessageFramed(hasher, plan);
  return hasher.Finish();
}

void ExpectSameBytes(const Plan& plan, const std::string& what) {
  ASSERT_TRUE(internal::PlanWireSize(plan).has_value()) << what;
  const std::string expected = ProtobufBytes(plan);
  EXPECT_EQ(internal::PlanWireSize(plan)->total, expected.size()) << what;
  EXPECT_EQ(SerializePlan(plan), expected) << what;
  EXPECT_EQ(DigestHex(PlanDigest(plan)), DigestHex(ProtobufDigest(plan))) << what;
}

TEST(PlanWireTest, PlannedPlansMatchProtobufByteForByte) {
  for (const LengthDistribution distribution :
       {LengthDistribution::kUniform, LengthDistribution::kLongTail,
        LengthDistribution::kAllEqual}) {
    for (const int cp : {1, 2, 8}) {
      for (const LossNormalization loss : {LOSS_TOKEN_MEAN, LOSS_SUM, LOSS_SEQUENCE_MEAN}) {
        RandomBatchOptions options;
        options.distribution = distribution;
        options.num_sequences = 3000;
        options.max_length = 4096;
        options.seed = static_cast<uint64_t>(cp) * 7 + static_cast<uint64_t>(loss);
        options.weighted_fraction = 0.1;
        const std::vector<Sequence> batch = RandomBatch(options);
        absl::StatusOr<Plan> plan = PlanMicrobatches(batch, Normalized(8192, loss, cp));
        ASSERT_TRUE(plan.ok()) << plan.status();
        const std::string what = DistributionName(distribution) + " cp " + std::to_string(cp) +
                                 " loss " + std::to_string(loss);
        ExpectSameBytes(*plan, what);
        // Split plans carry token_begin arrays and a split count.
        absl::StatusOr<Plan> split = SplitMicrobatch(*plan, 0);
        ASSERT_TRUE(split.ok()) << split.status();
        absl::StatusOr<Plan> again = SplitMicrobatch(*split, 0);
        ASSERT_TRUE(again.ok()) << again.status();
        ExpectSameBytes(*again, what + " split twice");
      }
    }
  }
}

// Values no planner makes but a received or hand-built plan can hold: negative int32 and enum
// values (ten bytes each), -0.0 (written: its bits are not zero) and 0.0 (omitted), NaN, large
// int64, an empty limits message, empty microbatches, a plan larger than the writer's buffer.
TEST(PlanWireTest, EdgeValuesMatchProtobufByteForByte) {
  Plan empty;
  ExpectSameBytes(empty, "an empty plan");

  Plan plan;
  plan.mutable_limits();  // present, every field zero
  ExpectSameBytes(plan, "empty limits");
  plan.mutable_limits()->set_cp_size(-3);
  plan.mutable_limits()->set_max_tokens_per_microbatch(std::numeric_limits<int64_t>::min());
  plan.mutable_limits()->set_packing(static_cast<PackingPolicy>(-1));
  plan.set_num_sequences(-1);
  plan.set_num_tokens(std::numeric_limits<int64_t>::max());
  plan.set_loss_weight_total(-0.0);
  plan.set_splits(std::numeric_limits<int32_t>::min());
  plan.set_cp_chunk_rule(static_cast<CpChunkRule>(7));
  plan.set_loss_weights_digest(std::string(32, '\xff'));
  plan.add_microbatches();  // empty: tag and a zero length
  Microbatch& mb = *plan.add_microbatches();
  mb.set_num_tokens(-5);
  for (int i = 0; i < 40000; ++i) {  // several writer buffers
    mb.add_batch_index(i % 3 == 0 ? -i : i);
    mb.add_sequence_id(int64_t{1} << (i % 64));
    mb.add_cu_seqlens(static_cast<int64_t>(i) * 1000003);
    mb.add_loss_scale(i % 5 == 0 ? std::nan("") : 1.0 / (i + 1));
  }
  mb.add_token_begin(0);
  mb.add_shard_cp_rank(0);
  mb.add_shard_num_tokens(0);
  mb.add_shard_num_pieces(-2);
  ExpectSameBytes(plan, "edge values");
  plan.set_loss_weight_total(0.0);
  ExpectSameBytes(plan, "a zero loss weight total");
}

// Unknown fields (a newer writer's plan, parsed) are protobuf's to write.
TEST(PlanWireTest, UnknownFieldsAreLeftToProtobuf) {
  Plan plan;
  plan.set_num_sequences(3);
  plan.add_microbatches()->set_num_tokens(4);
  std::string bytes = ProtobufBytes(plan);
  bytes += std::string("\xa0\x06\x01", 3);  // field 100, varint 1: unknown to plan.proto
  Plan parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_FALSE(internal::PlanWireSize(parsed).has_value());
  EXPECT_EQ(SerializePlan(parsed), ProtobufBytes(parsed));
  EXPECT_EQ(DigestHex(PlanDigest(parsed)), DigestHex(ProtobufDigest(parsed)));

  Plan inner = plan;
  std::string mb_bytes;
  ASSERT_TRUE(inner.microbatches(0).SerializeToString(&mb_bytes));
  mb_bytes += std::string("\xa0\x06\x01", 3);
  ASSERT_TRUE(inner.mutable_microbatches(0)->ParseFromString(mb_bytes));
  EXPECT_FALSE(internal::PlanWireSize(inner).has_value());
  EXPECT_EQ(DigestHex(PlanDigest(inner)), DigestHex(ProtobufDigest(inner)));
}

}  // namespace
}  // namespace planner
}  // namespace lockstep
