// admission/memory_model.h
//
// A model of a microbatch's peak device memory: a fixed term (weights, optimizer state,
// workspace), a per-token term (activations) and, when asked, a quadratic attention term (score
// entries: for each packed sequence, the tokens a rank holds times the sequence length). It is
// calibrated by least squares from measured peaks (MemoryProbe readings), and corrected after an
// out-of-memory failure so that the work that failed is never predicted to fit again.
//
// It also predicts what a microbatch leaves held once its forward returned (its outputs and the
// activations their autograd graph keeps for backward), per token (and per attention pair): the
// retained term. Work that hands back several microbatches at once keeps each one's retained
// bytes alive while the next runs, so its admission adds them up (admission.h, AdmitAllAtOnce).
//
// Contract:
// - Predict is deterministic and costs O(1): fixed + per_token * tokens + per_attention_pair *
//   attention_pairs, times the safety factor (>= 1, raised only by CorrectAfterOom).
// - Replicas of a TP x CP group must hold the same model so that they admit the same waves
//   (collective calls stay matched): the recovery loop checks the waves agree, and
//   MemoryModel::Serialize gives the bytes to agree on.
// - Calibrate refuses, naming the value, too few samples for the terms, a degenerate design
//   (every sample with the same shape), non-finite readings, and a fit with a negative slope
//   (readings that do not grow with the work); it reports the fit's worst relative error. With
//   retained readings in every sample it fits the retained term the same way.
//
// Thread-safety: const methods are safe concurrently; CorrectAfterOom is not.
//
// Example:
//   LOCKSTEP_ASSIGN_OR_RETURN(Calibration fit, MemoryModel::Calibrate(samples, {}));
//   double bytes = fit.model.Predict(ShapeOfMicrobatch(plan, m));

#ifndef LOCKSTEP_ADMISSION_MEMORY_MODEL_H_
#define LOCKSTEP_ADMISSION_MEMORY_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.pb.h"

namespace lockstep {
namespace admission {

// What memory is predicted from.
struct WorkShape {
  // The shape of `tokens` tokens and `attention_pairs` attention pairs.
  static WorkShape Of(int64_t tokens, double attention_pairs = 0) {
    WorkShape shape;
    shape.tokens = tokens;
    shape.attention_pairs = attention_pairs;
    return shape;
  }
  // Tokens the rank processes.
  int64_t tokens = 0;
  // Sum over packed sequences of (tokens of the sequence the rank holds) x (sequence length).
  double attention_pairs = 0;
};

// The work of several microbatches run together (a wave): tokens and pairs add up.
WorkShape operator+(const WorkShape& a, const WorkShape& b);

// The shape of microbatch `microbatch` of `plan` for the busiest CP rank (most tokens, most
// attention pairs), so that every replica of the group computes the same shape. Precondition:
// the microbatch index is in range and the plan is valid (planner::VerifyPlan).
WorkShape ShapeOfMicrobatch(const planner::Plan& plan, int microbatch);

// One measurement: a shape and the peak bytes it reached.
struct PeakSample {
  // A sample of `shape` that peaked at `peak_bytes`, its retained bytes not measured.
  static PeakSample Of(WorkShape shape, double peak_bytes) {
    PeakSample sample;
    sample.shape = shape;
    sample.peak_bytes = peak_bytes;
    return sample;
  }
  // The work measured.
  WorkShape shape;
  // The device memory's peak while it ran, in bytes (MemoryProbe: reset before, read after).
  double peak_bytes = 0;
  // Bytes still held once the work returned (allocated after it minus before: outputs and the
  // activations their graph keeps); -1 when not measured. Calibrate fits the retained term only
  // when every sample has it.
  double retained_bytes = -1;
};

class MemoryModel;

// What MemoryModel::Calibrate fits.
struct CalibrationOptions {
  // Fit the quadratic attention term too (needs samples with varied sequence lengths).
  bool attention_term = false;
};

struct Calibration;

// Predicted device memory of work by its shape (see the top of this file).
class MemoryModel {
 public:
  // A model with the given terms (bytes, bytes per token, bytes per attention pair), each finite
  // and non-negative; the safety factor starts at 1.
  static absl::StatusOr<MemoryModel> Of(double fixed_bytes, double bytes_per_token,
                                        double bytes_per_attention_pair = 0);

  // Least-squares fit of the terms to `samples` (at least as many as terms, with distinct
  // shapes).
  static absl::StatusOr<Calibration> Calibrate(const std::vector<PeakSample>& samples,
                                               const CalibrationOptions& options);

  // Predicted peak bytes of `shape`.
  double Predict(const WorkShape& shape) const;

  // This model with the retained term (bytes per token, bytes per attention pair, each finite and
  // non-negative; both 0 by default).
  absl::StatusOr<MemoryModel> WithRetained(double bytes_per_token,
                                           double bytes_per_attention_pair = 0) const;

  // Predicted bytes that work of `shape` leaves held once it returned, times the safety factor.
  double PredictRetained(const WorkShape& shape) const;

  // After work of `shape` ran out of memory under `cap_bytes`: raises the safety factor so that
  // this shape is predicted at 5% above the cap (never lowers it). Returns the new factor.
  double CorrectAfterOom(const WorkShape& shape, int64_t cap_bytes);

  // The fixed term, in bytes (before the safety factor).
  double fixed_bytes() const { return fixed_; }
  // The per-token term, in bytes per token (before the safety factor).
  double bytes_per_token() const { return per_token_; }
  // The attention term, in bytes per attention pair (before the safety factor; 0 without one).
  double bytes_per_attention_pair() const { return per_pair_; }
  // The retained term per token, in bytes (before the safety factor; 0 unless set).
  double retained_bytes_per_token() const { return retained_per_token_; }
  // The retained term per attention pair, in bytes (before the safety factor; 0 unless set).
  double retained_bytes_per_attention_pair() const { return retained_per_pair_; }
  // The factor every prediction is multiplied by: 1 at first, raised by CorrectAfterOom.
  double safety_factor() const { return safety_; }

  // The model's terms and factor as text that replicas can compare ("fixed=... factor=...",
  // doubles printed exactly).
  std::string Serialize() const;

 private:
  MemoryModel(double fixed, double per_token, double per_pair)
      : fixed_(fixed), per_token_(per_token), per_pair_(per_pair) {}
  double fixed_;
  double per_token_;
  double per_pair_;
  double retained_per_token_ = 0;
  double retained_per_pair_ = 0;
  double safety_ = 1.0;
};

// A fitted model and how well it fits its samples (MemoryModel::Calibrate).
struct Calibration {
  // `fitted`, with the errors not yet computed (0).
  explicit Calibration(MemoryModel fitted) : model(fitted) {}
  // The fitted model (safety factor 1).
  MemoryModel model;
  // Max over samples of |predicted - measured| / measured, for the peak bytes.
  double worst_relative_error = 0;
  // The root mean square over samples of the same relative error.
  double rms_relative_error = 0;
  // The same maximum for the retained bytes (0 when they were not measured).
  double worst_retained_relative_error = 0;
};

}  // namespace admission
}  // namespace lockstep

#endif  // LOCKSTEP_ADMISSION_MEMORY_MODEL_H_
