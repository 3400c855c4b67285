// numerics/op_recording_test.cc: a recording line written straight (AppendOperatorRecordLine)
// is the same text as the JSON value's dump (Note [Record lines]).

#include "numerics/op_recording.h"

#include <cmath>
#include <string>
#include <vector>

#include "base/json.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace numerics {
namespace {

OperatorValue Tensor(int arg, std::vector<int64_t> shape, double sum, double max_abs) {
  OperatorValue v;
  v.arg = arg;
  v.kind = "tensor";
  v.dtype = "F32";
  v.shape = std::move(shape);
  v.sum = sum;
  v.max_abs = max_abs;
  return v;
}

std::string Straight(const OperatorRecord& r) {
  std::string line;
  AppendOperatorRecordLine(r, &line);
  return line;
}

TEST(OperatorRecordLine, MatchesTheJsonValueOnEveryField) {
  OperatorRecord r;
  r.index = 41;
  r.op = "aten::index_add_";
  r.module = "layers.2.mlp";
  r.parent = 40;
  r.depth = 1;
  r.inputs.push_back(Tensor(0, {4, 8}, 0, 0));
  OperatorValue scalar;
  scalar.arg = 1;
  scalar.kind = "scalar";
  scalar.value = "[1,2]";
  r.inputs.push_back(scalar);
  OperatorValue listed = Tensor(2, {3}, 0, 0);
  listed.item = 1;
  listed.window_dims = {0, 2};
  listed.window_begin = 5;
  listed.window_end = 9;
  r.inputs.push_back(listed);
  OperatorValue none;
  none.arg = 3;
  none.kind = "none";
  r.inputs.push_back(none);
  OperatorValue empty = Tensor(4, {}, 0, 0);
  empty.kind = "uninitialized";
  r.inputs.push_back(empty);
  r.outputs.push_back(Tensor(0, {4, 8}, -12.625, 3.0));
  r.outputs.push_back(Tensor(1, {0}, 1e300, 1e-300));
  r.outputs.push_back(Tensor(2, {2}, std::nan(""), INFINITY));
  r.outputs.push_back(Tensor(3, {2}, -INFINITY, 0.1));
  r.inputs_digest[0] = 0xab;
  r.outputs_digest[15] = 0x01;
  EXPECT_EQ(Straight(r), DumpJson(OperatorRecordJson(r)));
}

TEST(OperatorRecordLine, EscapesAsTheJsonValueDoes) {
  for (const std::string& text :
       {std::string("a\"quote"), std::string("back\\slash"), std::string("tab\tnew\nline"),
        std::string("\x01 control"), std::string("caf\xc3\xa9"), std::string("bad \xff byte"),
        std::string("del\x7f"), std::string("")}) {
    OperatorRecord r;
    r.op = text;
    r.module = text;
    OperatorValue v;
    v.kind = "other";
    v.value = text;
    r.inputs.push_back(v);
    EXPECT_EQ(Straight(r), DumpJson(OperatorRecordJson(r))) << text;
  }
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
