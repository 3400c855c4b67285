#include "admission/memory_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"
#include "planner/planner.h"

namespace lockstep {
namespace admission {

WorkShape operator+(const WorkShape& a, const WorkShape& b) {
  return WorkShape::Of(a.tokens + b.tokens, a.attention_pairs + b.attention_pairs);
}

WorkShape ShapeOfMicrobatch(const planner::Plan& plan, int microbatch) {
  const planner::Microbatch& m = plan.microbatches(microbatch);
  const int cp_size = std::max(1, plan.limits().cp_size());
  WorkShape busiest;
  for (int rank = 0; rank < cp_size; ++rank) {
    absl::StatusOr<std::vector<planner::ShardPiece>> pieces =
        planner::ShardPieces(plan, microbatch, rank);
    if (!pieces.ok()) {
      // Not a valid plan (a precondition): the whole microbatch on one rank is an upper bound.
      double pairs = 0;
      for (int k = 0; k + 1 < m.cu_seqlens_size(); ++k) {
        const double n = static_cast<double>(m.cu_seqlens(k + 1) - m.cu_seqlens(k));
        pairs += n * n;
      }
      return WorkShape::Of(m.num_tokens(), pairs);
    }
    WorkShape shape;
    for (const planner::ShardPiece& piece : *pieces) {
      const int64_t length = piece.end - piece.begin;
      const int64_t sequence_length =
          m.cu_seqlens(piece.sequence + 1) - m.cu_seqlens(piece.sequence);
      shape.tokens += length;
      shape.attention_pairs += static_cast<double>(length) * static_cast<double>(sequence_length);
    }
    busiest.tokens = std::max(busiest.tokens, shape.tokens);
    busiest.attention_pairs = std::max(busiest.attention_pairs, shape.attention_pairs);
  }
  return busiest;
}

absl::StatusOr<MemoryModel> MemoryModel::Of(double fixed_bytes, double bytes_per_token,
                                            double bytes_per_attention_pair) {
  for (const auto& term : {std::make_pair("fixed_bytes", fixed_bytes),
                           std::make_pair("bytes_per_token", bytes_per_token),
                           std::make_pair("bytes_per_attention_pair", bytes_per_attention_pair)}) {
    if (!std::isfinite(term.second) || term.second < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory model: ", term.first, " = ", term.second, " must be finite and non-negative"));
    }
  }
  return MemoryModel(fixed_bytes, bytes_per_token, bytes_per_attention_pair);
}

namespace {

// Least squares of `target` on the columns of `design` (row-major, `terms` columns), each column
// scaled to a maximum of 1 first, so that bytes, tokens and pairs of very different magnitudes
// are fitted as well-conditioned as the data allow. `names` name the columns in errors.
absl::StatusOr<std::vector<double>> FitColumns(std::vector<double> design,
                                               std::vector<double> target, int terms,
                                               const std::vector<std::string>& names,
                                               absl::string_view what, bool attention_term) {
  const int64_t n = static_cast<int64_t>(target.size());
  std::vector<double> scale(terms, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < terms; ++j) scale[j] = std::max(scale[j], std::abs(design[i * terms + j]));
  }
  for (int j = 0; j < terms; ++j) {
    if (scale[j] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory model calibration: every sample has 0 ", names[j],
                       "; the term cannot be fitted"));
    }
    for (int64_t i = 0; i < n; ++i) design[i * terms + j] /= scale[j];
  }
  std::vector<double> solution(terms);
  int64_t rank = 0;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("memory model least squares", [&] {
    const auto options64 = at::TensorOptions().dtype(at::kDouble);
    at::Tensor a = at::from_blob(design.data(), {n, terms}, options64).clone();
    at::Tensor b = at::from_blob(target.data(), {n, 1}, options64).clone();
    auto result = at::linalg_lstsq(a, b, c10::nullopt, c10::string_view("gelsd"));
    at::Tensor x = std::get<0>(result).contiguous();
    rank = std::get<2>(result).item<int64_t>();
    for (int j = 0; j < terms; ++j) solution[j] = x[j][0].item<double>() / scale[j];
  }));
  if (rank < terms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory model calibration: the samples determine only ", rank, " of ", terms, " terms of ",
        what, " (shapes too alike); measure at more distinct token counts",
        attention_term ? " and sequence lengths" : ""));
  }
  return solution;
}

}  // namespace

absl::StatusOr<Calibration> MemoryModel::Calibrate(const std::vector<PeakSample>& samples,
                                                   const CalibrationOptions& options) {
  const int terms = options.attention_term ? 3 : 2;
  if (static_cast<int>(samples.size()) < terms) {
    return absl::InvalidArgumentError(absl::StrCat("memory model calibration: ", samples.size(),
                                                   " samples for ", terms,
                                                   " terms; need at least as many samples"));
  }
  bool retained_measured = true;
  for (size_t i = 0; i < samples.size(); ++i) {
    const PeakSample& s = samples[i];
    if (!std::isfinite(s.peak_bytes) || s.peak_bytes <= 0 || s.shape.tokens < 0 ||
        !std::isfinite(s.shape.attention_pairs) || s.shape.attention_pairs < 0 ||
        !std::isfinite(s.retained_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory model calibration: sample ", i, " (tokens ", s.shape.tokens,
                       ", pairs ", s.shape.attention_pairs, ", peak ", s.peak_bytes,
                       " bytes, retained ", s.retained_bytes, " bytes) is not a valid reading"));
    }
    retained_measured = retained_measured && s.retained_bytes >= 0;
  }
  const int64_t n = static_cast<int64_t>(samples.size());
  // The peak: fixed + per token (+ per pair).
  std::vector<double> design(n * terms), target(n);
  for (int64_t i = 0; i < n; ++i) {
    const double row[3] = {1.0, static_cast<double>(samples[i].shape.tokens),
                           samples[i].shape.attention_pairs};
    for (int j = 0; j < terms; ++j) design[i * terms + j] = row[j];
    target[i] = samples[i].peak_bytes;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      std::vector<double> peak,
      FitColumns(design, target, terms, {"fixed", "tokens", "attention pairs"}, "the peak",
                 options.attention_term));
  const char* names[3] = {"fixed bytes", "bytes per token", "bytes per attention pair"};
  for (int j = 1; j < terms; ++j) {
    if (peak[j] < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("memory model calibration: the fit gives ", names[j], " = ", peak[j],
                       " < 0: the readings do not grow with the work; measure over a wider range"));
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(MemoryModel model, MemoryModel::Of(std::max(0.0, peak[0]), peak[1],
                                                               terms == 3 ? peak[2] : 0.0));
  // What stays held until the hand-back: per token (+ per pair), through the origin (no work
  // retains nothing).
  if (retained_measured) {
    const int retained_terms = terms - 1;
    std::vector<double> retained_design(n * retained_terms), retained_target(n);
    for (int64_t i = 0; i < n; ++i) {
      retained_design[i * retained_terms] = static_cast<double>(samples[i].shape.tokens);
      if (retained_terms == 2) retained_design[i * 2 + 1] = samples[i].shape.attention_pairs;
      retained_target[i] = samples[i].retained_bytes;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(
        std::vector<double> retained,
        FitColumns(retained_design, retained_target, retained_terms, {"tokens", "attention pairs"},
                   "the retained bytes", options.attention_term));
    for (int j = 0; j < retained_terms; ++j) {
      if (retained[j] < 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "memory model calibration: the fit gives retained ", names[j + 1], " = ", retained[j],
            " < 0: the retained readings do not grow with the work; measure over a wider range"));
      }
    }
    LOCKSTEP_ASSIGN_OR_RETURN(
        model, model.WithRetained(retained[0], retained_terms == 2 ? retained[1] : 0));
  }
  Calibration calibration(model);
  double squares = 0;
  for (const PeakSample& s : samples) {
    const double relative = std::abs(model.Predict(s.shape) - s.peak_bytes) / s.peak_bytes;
    calibration.worst_relative_error = std::max(calibration.worst_relative_error, relative);
    squares += relative * relative;
    if (retained_measured && s.retained_bytes > 0) {
      calibration.worst_retained_relative_error =
          std::max(calibration.worst_retained_relative_error,
                   std::abs(model.PredictRetained(s.shape) - s.retained_bytes) / s.retained_bytes);
    }
  }
  calibration.rms_relative_error = std::sqrt(squares / static_cast<double>(n));
  return calibration;
}

absl::StatusOr<MemoryModel> MemoryModel::WithRetained(double bytes_per_token,
                                                      double bytes_per_attention_pair) const {
  for (const auto& term :
       {std::make_pair("retained bytes_per_token", bytes_per_token),
        std::make_pair("retained bytes_per_attention_pair", bytes_per_attention_pair)}) {
    if (!std::isfinite(term.second) || term.second < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory model: ", term.first, " = ", term.second, " must be finite and non-negative"));
    }
  }
  MemoryModel model = *this;
  model.retained_per_token_ = bytes_per_token;
  model.retained_per_pair_ = bytes_per_attention_pair;
  return model;
}

double MemoryModel::PredictRetained(const WorkShape& shape) const {
  return (retained_per_token_ * static_cast<double>(shape.tokens) +
          retained_per_pair_ * shape.attention_pairs) *
         safety_;
}

double MemoryModel::Predict(const WorkShape& shape) const {
  return (fixed_ + per_token_ * static_cast<double>(shape.tokens) +
          per_pair_ * shape.attention_pairs) *
         safety_;
}

double MemoryModel::CorrectAfterOom(const WorkShape& shape, int64_t cap_bytes) {
  const double raw = Predict(shape) / safety_;
  if (raw > 0) safety_ = std::max(safety_, 1.05 * static_cast<double>(cap_bytes) / raw);
  return safety_;
}

std::string MemoryModel::Serialize() const {
  return absl::StrFormat(
      "fixed=%a per_token=%a per_pair=%a retained_per_token=%a retained_per_pair=%a factor=%a",
      fixed_, per_token_, per_pair_, retained_per_token_, retained_per_pair_, safety_);
}

}  // namespace admission
}  // namespace lockstep
