// cc_proto (proto.bzl) generates C++ with the system protoc that links against the system
// runtime: a message survives a serialize/parse round trip.
#include <string>

#include "gtest/gtest.h"
#include "third_party/proto_macro_test.pb.h"

namespace {

TEST(CcProtoTest, GeneratedMessageRoundTrips) {
  lockstep::third_party_test::Sample sample;
  sample.set_name("model-stream");
  sample.add_values(7);
  sample.add_values(-9);
  sample.set_state(std::string("\0\x01\xff", 3));
  const std::string bytes = sample.SerializeAsString();
  ASSERT_FALSE(bytes.empty());

  lockstep::third_party_test::Sample parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.name(), "model-stream");
  ASSERT_EQ(parsed.values_size(), 2);
  EXPECT_EQ(parsed.values(1), -9);
  EXPECT_EQ(parsed.state(), std::string("\0\x01\xff", 3));
  EXPECT_FALSE(parsed.ParseFromString(std::string("\xff\xff\xff", 3)));
}

}  // namespace
