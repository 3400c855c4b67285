#include "collectives/communicator.h"

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fake_communicator.h"

namespace lockstep {
namespace collectives {
namespace {

using ::testing::HasSubstr;

// A message-like object: what BroadcastObject needs of a protobuf message.
struct Seeds {
  std::vector<int> values;
  std::string SerializeAsString() const {
    std::string out;
    for (int v : values) absl::StrAppend(&out, v, ",");
    return out;
  }
  bool ParseFromString(const std::string& in) {
    values.clear();
    size_t start = 0;
    for (size_t comma = in.find(','); comma != std::string::npos; comma = in.find(',', start)) {
      values.push_back(std::stoi(in.substr(start, comma - start)));
      start = comma + 1;
    }
    return start == in.size();
  }
};

TEST(BroadcastBytesTest, EveryLengthFromEmptyToLargeReachesEveryRank) {
  for (size_t length : {0, 1, 17, 65536}) {
    collectives::FakeWorld world(3);
    std::vector<absl::Status> results = world.Run([length](Communicator& comm) -> absl::Status {
      std::string bytes;
      if (comm.rank() == 1) {
        for (size_t i = 0; i < length; ++i) bytes.push_back(static_cast<char>(i * 7 + 3));
      } else {
        bytes = "stale";
      }
      if (auto s = BroadcastBytes(comm, &bytes, 1); !s.ok()) return s;
      if (bytes.size() != length) return absl::InternalError("length");
      for (size_t i = 0; i < length; ++i)
        if (bytes[i] != static_cast<char>(i * 7 + 3)) return absl::InternalError("content");
      return absl::OkStatus();
    });
    for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << length << ": " << s;
  }
}

TEST(BroadcastObjectTest, RoundTripsAMessage) {
  collectives::FakeWorld world(2);
  std::vector<Seeds> got(2);
  std::vector<absl::Status> results = world.Run([&](Communicator& comm) {
    Seeds seeds;
    if (comm.rank() == 0) seeds.values = {42, 7, -3};
    absl::Status s = BroadcastObject(comm, &seeds, 0);
    got[comm.rank()] = seeds;
    return s;
  });
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got[1].values, (std::vector<int>{42, 7, -3}));
}

TEST(BroadcastBytesTest, BadRootIsNamed) {
  collectives::FakeWorld world(1);
  std::vector<absl::Status> results = world.Run([](Communicator& comm) {
    std::string bytes = "x";
    return BroadcastBytes(comm, &bytes, 3);
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(results[0].message(), HasSubstr("root 3 is outside [0, 1)"));
}

TEST(GlobalRankTest, TranslatesGroupRanksAndRejectsOthers) {
  collectives::FakeWorld world(4);
  std::vector<absl::Status> results = world.Run([](Communicator& comm) -> absl::Status {
    if (comm.rank() < 2) return absl::OkStatus();
    auto group = comm.NewGroup({3, 2});
    if (!group.ok()) return group.status();
    absl::StatusOr<int> first = (*group)->GlobalRank(0);
    if (!first.ok()) return first.status();
    absl::StatusOr<int> second = (*group)->GlobalRank(1);
    if (!second.ok()) return second.status();
    if (*first != 3 || *second != 2) return absl::InternalError("translation");
    if ((*group)->rank() != (comm.rank() == 3 ? 0 : 1)) return absl::InternalError("rank");
    if ((*group)->GlobalRank(2).status().code() != absl::StatusCode::kInvalidArgument)
      return absl::InternalError("range");
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(ValidateGroupRanksTest, NamesTheOffendingRank) {
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(const int member, ValidateGroupRanks({4, 6}, 8, 6));
  EXPECT_EQ(member, 1);
  EXPECT_THAT(ValidateGroupRanks({}, 8, 0).status().message(), HasSubstr("at least one"));
  EXPECT_THAT(ValidateGroupRanks({1, 9}, 8, 1).status().message(),
              HasSubstr("rank 9 in group [1, 9] is outside the world [0, 8)"));
  EXPECT_THAT(ValidateGroupRanks({1, 1}, 8, 1).status().message(), HasSubstr("appears twice"));
  EXPECT_THAT(ValidateGroupRanks({1, 2}, 8, 3).status().message(),
              HasSubstr("global rank 3 is not a member"));
}

}  // namespace
}  // namespace collectives
}  // namespace lockstep
