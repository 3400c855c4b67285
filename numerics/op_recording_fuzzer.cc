// Fuzz target (base/fuzz_target.h) for the operator recording reader on arbitrary bytes.
//
// Oracle: OperatorRecording::Load returns kInvalidArgument or a recording (never a crash, an
// abort on a mistyped field, or a line read past kMaxOperatorRecordLine); an accepted recording,
// written again line by line (AppendOperatorRecordLine), reads back as the same lines.

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/fuzz_target.h"
#include "numerics/op_recording.h"

namespace lockstep {

namespace {

// Where each input is written for Load, which reads a file.
std::string ScratchPath() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/op_recording_fuzz.", getpid());
}

std::string Header(int rank) {
  return absl::StrCat("{\"", numerics::kOperatorRecordingKey,
                      "\":", numerics::kOperatorRecordingVersion, ",\"rank\":", rank, "}\n");
}

// The recording's text as the recorder writes it.
std::string Text(const numerics::OperatorRecording& recording) {
  std::string text = Header(recording.rank());
  for (const numerics::OperatorRecord& r : recording.records()) {
    numerics::AppendOperatorRecordLine(r, &text);
    text += "\n";
  }
  return text;
}

numerics::OperatorValue Tensor(int arg, std::vector<int64_t> shape, bool output) {
  numerics::OperatorValue v;
  v.arg = arg;
  v.kind = "tensor";
  v.dtype = "F32";
  v.shape = std::move(shape);
  if (output) {
    v.sum = 1.5;
    v.max_abs = 0.75;
  }
  return v;
}

}  // namespace

std::vector<std::string> FuzzSeeds() {
  numerics::OperatorRecord add;
  add.index = 0;
  add.op = "aten::add";
  add.module = "block0.mlp";
  add.inputs = {Tensor(0, {2, 3}, false), Tensor(1, {2, 3}, false)};
  numerics::OperatorValue alpha;
  alpha.arg = 2;
  alpha.kind = "scalar";
  alpha.value = "1";
  add.inputs.push_back(alpha);
  add.outputs = {Tensor(0, {2, 3}, true)};
  numerics::OperatorRecord windowed = add;
  windowed.index = 1;
  windowed.parent = 0;
  windowed.depth = 1;
  windowed.op = "aten::mm \"quoted\\\\";
  windowed.inputs[0].window_dims = {0};
  windowed.inputs[0].window_begin = 0;
  windowed.inputs[0].window_end = 1;
  windowed.outputs[0].sum = -2;
  return {Header(0), Text(numerics::OperatorRecording(3, {add})),
          Text(numerics::OperatorRecording(1, {add, windowed}))};
}

}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::numerics::OperatorRecording;
  static const std::string path = lockstep::ScratchPath();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  lockstep::WriteOptions fast;
  fast.durable = false;
  absl::Status written = lockstep::WriteFileAtomically(path, bytes, fast);
  LOCKSTEP_FUZZ_CHECK(written.ok(), written.ToString());
  absl::StatusOr<OperatorRecording> loaded = OperatorRecording::Load(path);
  if (!loaded.ok()) {
    LOCKSTEP_FUZZ_CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument,
                        loaded.status().ToString());
    return 0;
  }
  const std::string again = lockstep::Text(*loaded);
  written = lockstep::WriteFileAtomically(path, again, fast);
  LOCKSTEP_FUZZ_CHECK(written.ok(), written.ToString());
  absl::StatusOr<OperatorRecording> reloaded = OperatorRecording::Load(path);
  LOCKSTEP_FUZZ_CHECK(reloaded.ok(), reloaded.status().ToString());
  LOCKSTEP_FUZZ_CHECK(lockstep::Text(*reloaded) == again,
                      "the written recording reads back changed");
  return 0;
}
