// base/sha256_message: streaming a message through the hasher gives the digest of its framed
// deterministic bytes, for messages smaller and larger than the stream's 64 KiB buffer.

#include "base/sha256_message.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.pb.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace {

google::protobuf::FileDescriptorProto MessageWith(int fields) {
  google::protobuf::FileDescriptorProto file;
  file.set_name("lockstep_test.proto");
  google::protobuf::DescriptorProto* message = file.add_message_type();
  message->set_name("Big");
  for (int i = 0; i < fields; ++i) {
    google::protobuf::FieldDescriptorProto* field = message->add_field();
    field->set_name(absl::StrCat("field_number_", i));
    field->set_number(i + 1);
  }
  return file;
}

TEST(Sha256MessageTest, StreamedDigestEqualsTheDigestOfTheFramedBytes) {
  for (int fields : {0, 3, 5000}) {  // 5000 fields: well over one 64 KiB buffer
    const google::protobuf::FileDescriptorProto message = MessageWith(fields);
    const std::string bytes = SerializeDeterministically(message);
    ASSERT_EQ(bytes.size(), message.ByteSizeLong());
    if (fields == 5000) {
      ASSERT_GT(bytes.size(), size_t{1} << 16);
    }
    Sha256Hasher streamed;
    streamed.AppendFramed("tag");
    AppendMessageFramed(streamed, message);
    EXPECT_EQ(streamed.Finish(), Sha256Framed({"tag", bytes})) << fields << " fields";
  }
}

TEST(Sha256MessageTest, DifferentMessagesHashDifferently) {
  Sha256Hasher a, b;
  AppendMessageFramed(a, MessageWith(3));
  AppendMessageFramed(b, MessageWith(4));
  EXPECT_NE(a.Finish(), b.Finish());
}

}  // namespace
}  // namespace lockstep
