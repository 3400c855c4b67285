// qualification/negative_controls.h
//
// The negative controls qualify offers (`qualify --negative_control NAME`): deliberate bugs of
// the kinds lockstep exists to prevent, each of which qualify's checks must detect as a failure.
// They prove the checks can fail. Never use them otherwise.
//
//   no-sync              skip RNG synchronization across the TP x CP group
//   no-sync-after-microbatch
//                        the trainer oracle's microbatch stream does not synchronize the caller
//                        after its hand-backs (ForwardAllMicrobatches still does)
//   no-sync-after-dp-forward
//                        ForwardAllMicrobatches does not synchronize the caller after it returns
//                        (the stream still does)
//   no-restore-on-unwind a model-stream scope left by unwinding (an exception, an early error
//                        return) does not put the caller's state back
//   world-sync           synchronize across the whole world instead of each TP x CP group, so
//                        different DP workers are coupled
//   unscoped-model-work  run the model's random work on the caller's stream (no model-stream
//                        scope)
//   aliasing-snapshot    activation checkpoints save aliases of the live generators instead of
//                        values (AliasingRngSaver), so recompute does not rewind
//   shard-local-philox   each rank draws its shard of a partitioned mask as if its shard were the
//                        whole tensor (local instead of global element indices)
//   double-counted-retry out-of-memory recovery keeps a failed attempt's gradient contribution
//                        (a staging that never discards), so a retried microbatch counts twice
//   staging-replaces     committing a microbatch's staged gradient replaces the accumulated
//                        gradient instead of adding to it, so every earlier microbatch is lost
//   input-inside-scope   the trainer oracle's caller materialises its inputs on the model stream
//   resume-without-named-streams
//                        the trainer oracle's restart leaves its named streams fresh instead of
//                        restoring them
//   resume-without-caller-stream
//                        the trainer oracle's restart keeps the caller's generators as the new
//                        process had them instead of restoring the saved ones
//   resume-without-model-stream
//                        the trainer oracle's restart leaves the model stream to be derived
//                        afresh instead of restoring it
//   resume-without-optimizer
//                        the trainer oracle's restart drops the optimizer's restored state (Adam
//                        starts again from nothing)
//   cp-local-attention   the reference model's attention over its own CP rank's keys only (the
//                        keys, values and their tokens not gathered), in the split run and in
//                        the unsplit reference alike, where it changes nothing (CP > 1)
//   tp-unreduced-gradient
//                        the reference model's TP-split MLP input not reduced over TP in backward
//                        (each TP rank keeps a partial gradient), in both runs alike (TP > 1)
//   empty-shard-skips-gather
//                        a microbatch that leaves a CP rank without tokens skips the trainer's
//                        output gather: each member hands back its own rows, the others zero
//   actor-partial-load   each actor's load leaves Adam's state behind (both actors alike)
//   misrouted-gather     the trainer's output gather reads each other CP rank's rows from the
//                        next CP rank's shard (CP > 1)
//   repeatability-stream-not-restored
//                        repeatability's passes do not restore the model and named streams
//                        between them, so each pass draws where the previous one stopped
//   libtorch-attention   under placement-invariant mode (qualify --placement_invariant), the
//                        reference model's attention is LibTorch's masked softmax over every key
//                        of the microbatch instead of invariant::SequenceAttention
//   nondeterministic-op  one module of the reference model (qualification/variability.h's
//                        kNondeterministicModule) reduces in an order that changes from call to
//                        call: floating-point atomics on a GPU, a randomly ordered sum on the CPU
// Each control is named once here and mapped once onto what it breaks: TrainerSeamsFor maps the
// trainer's controls onto TrainerRank's contract seams (trainer/internal/trainer_core.h); the
// others are planted by the check that owns them (the RNG checks, the recompute check, the
// out-of-memory check, the oracle's caller, the variability checks' reference model). no-sync and
// unscoped-model-work therefore also switch off the trainer's caller synchronization and its
// model-stream scope in the trainer oracle.
//
// Thread-safety: as the default generators (one thread).

#ifndef LOCKSTEP_QUALIFICATION_NEGATIVE_CONTROLS_H_
#define LOCKSTEP_QUALIFICATION_NEGATIVE_CONTROLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/rng_state_saver.h"
#include "rng/generators.h"
#include "trainer/internal/contract_seams.h"

namespace lockstep {
namespace qualification {

// A deliberate bug qualify can plant (see the top of this file for what each breaks).
enum class NegativeControl {
  kNone,                            // no control: lockstep as it is
  kNoSync,                          // no-sync
  kWorldSync,                       // world-sync
  kUnscopedModelWork,               // unscoped-model-work
  kAliasingSnapshot,                // aliasing-snapshot
  kShardLocalPhilox,                // shard-local-philox
  kDoubleCountedRetry,              // double-counted-retry
  kInputInsideScope,                // input-inside-scope
  kNoSyncAfterMicrobatch,           // no-sync-after-microbatch
  kNoSyncAfterDpForward,            // no-sync-after-dp-forward
  kNoRestoreOnUnwind,               // no-restore-on-unwind
  kStagingReplaces,                 // staging-replaces
  kResumeWithoutNamedStreams,       // resume-without-named-streams
  kNondeterministicOp,              // nondeterministic-op
  kResumeWithoutCallerStream,       // resume-without-caller-stream
  kResumeWithoutModelStream,        // resume-without-model-stream
  kResumeWithoutOptimizer,          // resume-without-optimizer
  kRepeatabilityStreamNotRestored,  // repeatability-stream-not-restored
  kMisroutedGather,                 // misrouted-gather
  kCpLocalAttention,                // cp-local-attention
  kTpUnreducedGradient,             // tp-unreduced-gradient
  kEmptyShardSkipsGather,           // empty-shard-skips-gather
  kActorPartialLoad,                // actor-partial-load
  kLibTorchAttention,               // libtorch-attention
};

// The command-line name of `control` ("" for kNone).
std::string NegativeControlName(NegativeControl control);
// Every control's name, in declaration order, without kNone's.
std::vector<std::string> NegativeControlNames();
// The control named `name` ("" or "none": kNone). kInvalidArgument naming the value and the
// known names otherwise.
absl::StatusOr<NegativeControl> ParseNegativeControl(absl::string_view name);

// The parts of TrainerRank's contract `control` switches off (everything kept for a control that
// is not the trainer's).
trainer::internal::ContractSeams TrainerSeamsFor(NegativeControl control);

// A deliberately wrong checkpoint::RngStateSaver: it "saves" the default CPU and CUDA generators
// by keeping handles to the live generators instead of copying their values — the aliasing bug
// of real checkpoint implementations. Its Restore() writes the generators' current state back
// into themselves, so a recompute does not rewind and draws different masks than the forward.
class AliasingRngSaver : public checkpoint::RngStateSaver {
 public:
  // A saver that aliases the default CPU generator and, where `generators` has one, that CUDA
  // device's default generator.
  explicit AliasingRngSaver(rng::DefaultGenerators generators) : generators_(generators) {}
  // Handles to the live generators, not their values (the bug; see above).
  absl::StatusOr<std::unique_ptr<checkpoint::SavedRngState>> Save() const override;

 private:
  rng::DefaultGenerators generators_;
};

}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_NEGATIVE_CONTROLS_H_
