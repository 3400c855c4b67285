// invariant/exact_gradients.h
//
// ExactGradients: the weight gradients of placement-invariant mode, summed exactly (Note [Exact
// accumulation]) over a call's rows, the step's microbatches and the ranks, and rounded once.
// The mode's differentiable kernels (invariant/ops.h) take one and a parameter's slot in it;
// their backward adds that parameter's per-token contributions here instead of into .grad.
//
//   auto exact = std::make_shared<invariant::ExactGradients>(parameters);
//   for (each microbatch) { ... invariant::Linear(x, w, {exact.get(), slot_of_w}) ... backward; }
//   LOCKSTEP_RETURN_IF_ERROR(exact->SumOver(dp_cp_group));  // exact: integer sums
//   LOCKSTEP_RETURN_IF_ERROR(exact->WriteGradients());      // .grad, rounded once; sums zeroed
//
// Note [Exact accumulation]
// A weight's gradient is a sum over every token of the step, grouped by the placement: the rows
// of one call, then autograd's accumulation over microbatches, then an all-reduce over ranks. In
// floating point each grouping rounds differently. Here each token's contribution (the product
// of two values, exact in float64 for float32, bfloat16 and float16 inputs) is rounded once to a
// multiple of 2^-kFractionBits and added as a 128-bit integer: integer addition is associative,
// so the total is the same in every grouping and order, and it is rounded to the parameter's
// dtype once, when written. Binned reproducible summation (ReproBLAS) would keep more bits for
// sums of tiny values, but needs either a maximum over the whole step before the first deposit
// (unknown while microbatches still run) or several bins per element; one fixed-point integer
// needs neither. Error: at most 2^-(kFractionBits + 1) per contribution, then the final rounding.
// Range: a contribution of magnitude 2^kMaxExponent or more, or more than 2^kMaxTermsLog2
// contributions to one element between two WriteGradients, is refused with kOutOfRange naming the
// parameter, so that no sum can leave the 128 bits (never wrapped silently).
//
// Where: a parameter on a CUDA device has its contributions from that device summed there
// (invariant/internal/exact_kernels.h: the same integer rounding, so the same bits as the host's),
// after one read-back of a bound on their range; a call the bound cannot clear, and every other
// parameter, is summed on the host. The device's sums join the host's (integer addition) before
// they are read, reduced or written. An attempt that fails after depositing (out of memory in
// backward) is not undone: callers stage forward-only failures (the trainer's out-of-memory
// recovery retries forwards).
//
// Thread-safety: one thread at a time (autograd's backward runs deposits on its own thread, one
// after another for one graph).

#ifndef LOCKSTEP_INVARIANT_EXACT_GRADIENTS_H_
#define LOCKSTEP_INVARIANT_EXACT_GRADIENTS_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace invariant {

// The exact gradient sums of a set of named parameters (see the top of this file).
class ExactGradients {
 public:
  // Contributions are multiples of 2^-kFractionBits, below 2^kMaxExponent in magnitude, at most
  // 2^kMaxTermsLog2 of them per element: 80 + 24 + 22 = 126 bits, and a sign.
  static constexpr int kFractionBits = 80;
  // Contributions are below 2^kMaxExponent in magnitude.
  static constexpr int kMaxExponent = 24;
  // At most 2^kMaxTermsLog2 contributions per element between two writes.
  static constexpr int kMaxTermsLog2 = 22;

  // Exact sums for each of `parameters` (name, tensor), zero.
  explicit ExactGradients(std::vector<std::pair<std::string, at::Tensor>> parameters);

  // The slot of the parameter named `name`: kNotFound naming it otherwise.
  absl::StatusOr<int> SlotOf(const std::string& name) const;

  // Adds sum over t of a[t, n] * b[t, k] to element (n, k) of slot's parameter ([N, K]), for
  // a [T, N] and b [T, K] (floating point, any device). kInvalidArgument for shapes that do not
  // fit the parameter.
  absl::Status AddOuterProducts(int slot, const at::Tensor& a, const at::Tensor& b);

  // Adds row t of values [T, K] to row rows[t] of slot's parameter ([V, K]): an embedding's
  // gradient. kInvalidArgument for a row outside [0, V).
  absl::Status AddRows(int slot, const at::Tensor& rows, const at::Tensor& values);

  // Adds sum over t of values[t, k] to element k of slot's parameter (K elements, any shape:
  // a layer norm's weight or bias), for values [T, K] (floating point, any device), each value
  // rounded once to a multiple of 2^-kFractionBits. kInvalidArgument for a K that does not fit.
  absl::Status AddColumns(int slot, const at::Tensor& values);

  // Slot's sums rounded to float64, shaped as its parameter, on the CPU; the sums stay (a total
  // read before or instead of WriteGradients, such as a step's loss summed exactly).
  absl::StatusOr<at::Tensor> Sums(int slot);

  // Replaces every sum by its sum over `group`'s members (an integer all-reduce: exact), except
  // the parameters named in `whole`, whose sums every member already holds in full (a layer each
  // member computes over all of the step's tokens, such as a loss head over gathered outputs).
  // A null group: nothing to do.
  absl::Status SumOver(collectives::Communicator* group, const std::set<std::string>& whole = {});

  // Sets each parameter's .grad to its sum, rounded to float64 and from there to the
  // parameter's dtype (on its device), and zeroes the sums.
  absl::Status WriteGradients();

  // Zeroes the sums (the device's are released, and made anew by the next deposit there).
  void Zero();

 private:
  struct Slot {
    std::string name;
    at::Tensor parameter;
    // Two's complement, one per element: the sums; for a CUDA parameter, the deposits made on
    // the host (allocated by the first), until Gather adds them to device_sums.
    std::vector<unsigned __int128> sums;
    bool host_pending = false;  // a CUDA parameter's `sums` hold deposits
    // A CUDA parameter's sums on its device: int64 [elements, 2] (low and high words).
    // Undefined until the first deposit there (zero).
    at::Tensor device_sums;
    int64_t terms = 0;  // contributions per element since the last write
  };
  absl::StatusOr<Slot*> At(int slot);
  // kOutOfRange when `terms` more contributions per element of `s` would pass the limit.
  static absl::Status Room(const Slot& s, int64_t terms);
  // Whether `s`'s contributions from `t` are summed on t's device.
  static bool OnDevice(const Slot& s, const at::Tensor& t);
  // Allocates `s`'s host sums (zero) if it has none.
  static void ReadyHostSums(Slot& s);
  // Counts a deposit of `terms` contributions per element, made on the host or not.
  static void Deposited(Slot& s, int64_t terms, bool on_host);
  // When `largest` clears a call's contributions (their largest possible magnitude, one value
  // read back), deposits them into `s`'s device sums with `launch` and counts `terms`: true.
  // False, nothing done, when it does not: the caller's host path then checks each and names the
  // one it refuses.
  static absl::StatusOr<bool> DepositOnDevice(Slot& s, int64_t terms, const at::Tensor& largest,
                                              absl::FunctionRef<absl::Status(at::Tensor&)> launch);
  // `s`'s device sums (zero when new).
  static absl::StatusOr<at::Tensor*> DeviceSums(Slot& s);
  // A CUDA parameter's host deposits added into its device sums.
  static absl::Status Gather(Slot& s);
  // `s`'s sums rounded to float64, flat, on the parameter's device.
  static absl::StatusOr<at::Tensor> Rounded(Slot& s);
  std::vector<Slot> slots_;
};

// ExactSum: one number summed exactly (Note [Exact accumulation]) over every contribution of a
// step, whatever the microbatches, CP shards and DP ranks that made them: a step's loss, the
// same bits in every placement.
//
//   invariant::ExactSum loss;
//   for (each microbatch) LOCKSTEP_RETURN_IF_ERROR(loss.Add(per_token_terms.detach()));
//   LOCKSTEP_RETURN_IF_ERROR(loss.SumOver(dp_group));
//   LOCKSTEP_ASSIGN_OR_RETURN(double total, loss.Total());
//   loss.Zero();
//
// Thread-safety: one thread at a time.
class ExactSum {
 public:
  // A zero sum.
  static absl::StatusOr<ExactSum> Make();

  // Adds every element of `values` (floating point, any shape, any device), each rounded once to
  // a multiple of 2^-80 (ExactGradients' fraction bits); the limits of its AddColumns.
  absl::Status Add(const at::Tensor& values);

  // Replaces the sum by its sum over `group`'s members (exact); a null group: nothing to do.
  absl::Status SumOver(collectives::Communicator* group);

  // The sum rounded to float64; it stays.
  absl::StatusOr<double> Total();

  // Sets the sum to zero.
  void Zero();

 private:
  explicit ExactSum(ExactGradients sum) : sum_(std::move(sum)) {}
  ExactGradients sum_;  // one slot of one float64 element on the host
};

}  // namespace invariant
}  // namespace lockstep

#endif  // LOCKSTEP_INVARIANT_EXACT_GRADIENTS_H_
