// trainer/internal/device_rows.h  (private to trainer/)
//
// The device half of shard-input selection (shard_inputs.h): rows of a contiguous CUDA tensor
// copied by one cudaMemcpyAsync per run on the current stream, where ATen would queue its own
// copy, with less host time before the forward than ATen's strided copy or concatenation. The
// CUDA build implements it (device_rows_cuda.cc); elsewhere it declines (device_rows_no_cuda.cc),
// so no caller needs an #if.
//
// Thread-safety: stateless.

#ifndef LOCKSTEP_TRAINER_INTERNAL_DEVICE_ROWS_H_
#define LOCKSTEP_TRAINER_INTERNAL_DEVICE_ROWS_H_

#include <optional>

#include "ATen/core/Tensor.h"
#include "trainer/internal/shard_inputs.h"

namespace lockstep {
namespace trainer {
namespace internal {

// The rows `runs` of `rows` by one device copy per run, or nullopt where that does not apply: a
// CPU tensor, a non-contiguous one, one in an autograd graph (the copy is not recorded), more runs
// than a few (each copy's launch costs more than ATen's one kernel), or a build without CUDA.
// Throws c10::Error on a CUDA error.
std::optional<at::Tensor> CopyRunsOnDevice(const at::Tensor& rows, const RowRuns& runs);

}  // namespace internal
}  // namespace trainer
}  // namespace lockstep

#endif  // LOCKSTEP_TRAINER_INTERNAL_DEVICE_ROWS_H_
