// qualification/internal/reports.h  (private to //qualification)
//
// The ranks' reports of one qualify job and what the driver makes of them: each worker writes
// its checks as JSON in the job directory (Note [Reports across nodes]); the driver reads them,
// runs the actors' second round, folds every rank's entries into one row per check, and prints
// the table and writes the evidence.

#ifndef LOCKSTEP_QUALIFICATION_INTERNAL_REPORTS_H_
#define LOCKSTEP_QUALIFICATION_INTERNAL_REPORTS_H_

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "collectives/rendezvous.h"
#include "launch/launcher.h"
#include "nlohmann/json.hpp"
#include "qualification/qualification.h"

namespace lockstep {
namespace qualification {
namespace internal {

// Puts this rank's report in the rendezvous store; rank 0 writes every rank's into
// `prefix`<r>.json (Note [Reports across nodes]).
void GatherReports(collectives::Rendezvous& rendezvous, const nlohmann::json& report,
                   const std::string& prefix);

// The report at `path`, or a non-object when there is none or it is not one (a rank stopped
// before writing leaves none; reports are written whole, so a part is never seen).
nlohmann::json ReadReport(const std::string& path);

// The reports `prefix`<r>.json of ranks 0..world-1; an empty object (and an error naming it)
// for a rank whose report is missing or unreadable.
std::vector<nlohmann::json> ReadReports(const std::string& prefix, int world,
                                        std::vector<std::string>& errors);

// Launches this node's processes of the second actor (on every node: the round's port is the
// job's port + 1, so that none of them can meet the first round's store); each compares its
// rank's two actors (CheckSecondActor). Returns why the round failed, or "".
std::string LaunchSecondActor(launch::LaunchOptions launch, const std::string& dir);

// What this node's ranks [first, first + count) said went wrong, from their reports in `dir`
// (the main round's, then the actors' round's): "rank R: error" lines.
std::vector<std::string> NodeErrors(const std::string& dir, int first, int count);

// The "actors" check's entries, one per rank, from the second round's reports (or why a rank
// has none: its error, the round's `failure`, or no report).
std::vector<nlohmann::json> ActorsEntries(const std::string& dir, int world,
                                          const std::string& failure);

// Every rank's checks, folded: per check name (in the order rank 0 first reported them) each
// rank's entry, with the errors the ranks reported and what rank 0 says of the run.
struct CollectedChecks {
  std::vector<std::string> order;
  std::map<std::string, std::vector<nlohmann::json>> per_check;
  std::vector<std::string> errors;
  std::string transport = "unknown";
  // Rank r's host name.
  nlohmann::json hosts = nlohmann::json::array();
};

// Folds `reports` (ReadReports') into one CollectedChecks, starting from ReadReports' `errors`.
CollectedChecks CollectChecks(const std::vector<nlohmann::json>& reports,
                              std::vector<std::string> errors);

// Prints the table (one row per check: PASS only when every rank passed) and the verdict to
// `out`, and returns the evidence qualify writes; evidence["passed"] is the verdict.
nlohmann::json TableAndEvidence(const QualifyOptions& options, const CollectedChecks& checks,
                                const launch::LaunchResult& launched, const std::string& log_path,
                                std::ostream& out);

}  // namespace internal
}  // namespace qualification
}  // namespace lockstep

#endif  // LOCKSTEP_QUALIFICATION_INTERNAL_REPORTS_H_
