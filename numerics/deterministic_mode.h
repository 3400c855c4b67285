// numerics/deterministic_mode.h
//
// lockstep's deterministic mode: one call that sets every LibTorch, cuBLAS and NCCL setting a
// process needs to run the same computation the same way every time, and verifies that each
// setting is in force (VerifyDeterministicMode). It does not compare results: that is the
// repeatability harness's work (numerics/repeatability.h, qualify's repeatability and actors).
// Call it once per process, before any CUDA work (a cuBLAS handle reads its workspace setting
// when it is created, and an NCCL communicator its algorithm when it is made; one made before
// the call keeps what it read, and the mode refuses while one made with other settings exists:
// Note [NCCL reads its settings at creation] in base/nccl_settings.h):
//
//   LOCKSTEP_ASSIGN_OR_RETURN(numerics::DeterministicSettings mode,
//                             numerics::EnforceDeterministicMode());
//
// What it sets, and why each matters:
//   - deterministic algorithms, as errors (torch.use_deterministic_algorithms(True)): an
//     operator without a deterministic implementation (atomics in a CUDA index_add_, put_
//     without accumulation) fails instead of running; under CallTorch the failure is a status
//     naming the operator, never an abort.
//   - cuDNN deterministic on, benchmark off: benchmark mode times candidate kernels at run time
//     and may pick another one in the next process; a deterministic choice fixes it.
//   - CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8, which NVIDIA documents as equivalent), only
//     where the LibTorch built against demands it: Note [cuBLAS workspace setting].
//   - NCCL_ALGO=Ring and NCCL_PROTO=Simple: lockstep's collectives reduce floating-point values
//     over NCCL (AllReduceSum); NCCL picks its algorithm (ring, tree, NVLS) and protocol by
//     message size and topology, and each sums in another order. Pinned, the order depends only
//     on the ranks and the size. (Gloo's ring all-reduce has one order already.)
//
// Nothing is silently overridden: a setting the caller already made that contradicts the mode
// (one of the variables set to another value, warn-only deterministic algorithms, cuDNN
// benchmark on) is refused with kFailedPrecondition naming it, its value and the value the mode
// requires. A variable that is unset is set; one already at the required value is kept.
//
// Cost: the LibTorch settings cost nothing measurable; the cuBLAS variable, where it is set, a
// host time on every cuBLAS call (Note [cuBLAS workspace setting]). The README's benchmark
// section gives the figures.
//
// Note [cuBLAS workspace setting]
// cuBLAS's split-K products use a workspace; from its default pool, a handle used on several
// streams may take another buffer and sum in another order. cuBLAS documents two cures: the
// CUBLAS_WORKSPACE_CONFIG variable, or giving each stream a workspace of its own
// (cublasSetWorkspace). LibTorch does the second for every (handle, stream) pair it uses. An
// older LibTorch (one whose at::Context has alertCuBLASConfigNotDeterministic) still refuses
// cuBLAS under deterministic algorithms unless the variable is set; a newer one (2.11 among
// them) no longer asks. There the variable only costs: LibTorch reads and parses it with a
// regular expression on every cuBLAS call (at::cuda::getChosenWorkspaceSize is not cached), a
// host time per product that a step of many small products pays many times
// (examples/lm/cublas_call_probe.py measures it). So the mode sets the variable only for a
// LibTorch that demands it; a value already set is still checked against the documented ones,
// and the execution-context record shows it either way.
//
// Thread-safety: process-wide settings; call from one thread while no other uses LibTorch.

#ifndef LOCKSTEP_NUMERICS_DETERMINISTIC_MODE_H_
#define LOCKSTEP_NUMERICS_DETERMINISTIC_MODE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep {
namespace numerics {

// The settings the mode requires, and those it found in force when it returned. The defaults
// are the required values; EnforceDeterministicMode returns them with cublas_workspace_config as
// found in the environment (":4096:8" or ":16:8").
struct DeterministicSettings {
  // torch.use_deterministic_algorithms: on.
  bool deterministic_algorithms = true;
  // Its warn-only mode: off (a nondeterministic operator fails rather than warns).
  bool deterministic_algorithms_warn_only = false;
  // cuDNN deterministic: on.
  bool cudnn_deterministic = true;
  // cuDNN benchmark mode (kernel choice timed at run time): off.
  bool cudnn_benchmark = false;
  // CUBLAS_WORKSPACE_CONFIG: ":4096:8" (":16:8" is accepted too) where the LibTorch built
  // against demands it; elsewhere as found, empty when unset (Note [cuBLAS workspace setting]).
  std::string cublas_workspace_config = ":4096:8";
  // Whether that LibTorch demands it (CublasWorkspaceConfigRequired()).
  bool cublas_workspace_config_required = true;
  // NCCL_ALGO: "Ring".
  std::string nccl_algo = "Ring";
  // NCCL_PROTO: "Simple".
  std::string nccl_proto = "Simple";
};

// Sets and then verifies the mode (see the top of this file). kFailedPrecondition for a
// contradicting setting, or, where the variable is required, for CUBLAS_WORKSPACE_CONFIG unset
// once CUDA work has started (too late to take effect: set it in the environment, or call this
// first). On error nothing was changed. Idempotent.
absl::StatusOr<DeterministicSettings> EnforceDeterministicMode();

// Whether every setting of the mode is in force now: OK, or kFailedPrecondition naming the
// first that is not (its value and the required one).
absl::Status VerifyDeterministicMode();

// Whether the LibTorch this is built against refuses cuBLAS under deterministic algorithms
// unless CUBLAS_WORKSPACE_CONFIG is set (Note [cuBLAS workspace setting]).
bool CublasWorkspaceConfigRequired();

// For a process that runs deterministic work without enforcing the whole mode (qualify's
// workers, tests that switch deterministic algorithms on and off): call before its first cuBLAS
// call. Sets CUBLAS_WORKSPACE_CONFIG=:4096:8 where CublasWorkspaceConfigRequired() and it is
// unset; a value already set is kept, and elsewhere nothing is set.
void PrepareCublasForDeterminism();

// Whether EnforceDeterministicMode succeeded in this process (the execution-context record
// reports it).
bool DeterministicModeEnforced();

}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_DETERMINISTIC_MODE_H_
