// Ledger throughput (events per second, with and without fsync at step commit, and with fsync of
// every event) and admission planning time for 10k microbatches.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "admission/admission.h"
#include "admission/ledger.h"
#include "admission/memory_model.h"
#include "base/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "planner/planner.h"

namespace lockstep {
namespace admission {
namespace {

std::string BenchmarkPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(dir != nullptr ? dir : "/tmp", "/ledger_bench_", name, "_", getpid());
  RemoveLedgerFiles(path);
  return path;
}

// One step per iteration: 16 microbatches planned, each started and completed, then the commit
// (16 + 32 + 1 = 49 events).
void BM_LedgerStep(benchmark::State& state) {
  LedgerOptions options = LedgerOptions::Of(0);
  options.fsync_at_commit = state.range(0) >= 1;
  options.fsync_every_event = state.range(0) >= 2;
  const std::string path = BenchmarkPath(absl::StrCat("mode", state.range(0)));
  auto ledger = Ledger::OpenWriter(path, options);
  if (!ledger.ok()) {
    state.SkipWithError(std::string(ledger.status().message()).c_str());
    return;
  }
  std::vector<PlannedMicrobatch> work;
  for (int m = 0; m < 16; ++m) {
    work.push_back(PlannedMicrobatch::Of(absl::StrCat(m), {{m, 0, 4096}}));
  }
  int64_t step = 0, events = 0;
  for (auto _ : state) {
    bool ok = (*ledger)->BeginStep(step, work).ok();
    for (const PlannedMicrobatch& m : work) {
      ok = ok &&
           (*ledger)->Record(LedgerEvent::Of(LedgerEventKind::kStarted, step, m.id, m.ranges)).ok();
      ok = ok && (*ledger)
                     ->Record(LedgerEvent::Of(LedgerEventKind::kCompleted, step, m.id, m.ranges))
                     .ok();
    }
    ok = ok && (*ledger)->CommitStep(step).ok();
    if (!ok) {
      state.SkipWithError("a ledger operation failed");
      return;
    }
    ++step;
    events += 49;
  }
  state.SetItemsProcessed(events);
  state.counters["events_per_second"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  ledger->reset();
  RemoveLedgerFiles(path);
}
BENCHMARK(BM_LedgerStep)
    ->ArgName("fsync")  // 0: never, 1: at step commit (default), 2: every event
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A trainer's forward call of one microbatch (TrainerConfig::ledger): the step begins, the
// microbatch is started and completed, the step commits (fsync at commit, the default; arg
// background 1: CommitSync::kInBackground, whose fsync the next iteration's BeginStep waits for,
// having nothing else to do meanwhile). Counters give each part's mean in microseconds.
void BM_LedgerCallOfOneMicrobatch(benchmark::State& state) {
  // 0: direct calls, the commit fsynced before it returns; 1: the commit's fsync in the
  // background; 2: every write queued (what TrainerRank does): the counters time the caller's
  // side only; the writer is awaited after each step (a trainer's forward runs meanwhile), which
  // the iteration's own time includes.
  const bool queued = state.range(0) == 2;
  const Ledger::CommitSync sync =
      state.range(0) == 1 ? Ledger::CommitSync::kInBackground : Ledger::CommitSync::kBeforeReturn;
  const std::string path = BenchmarkPath(absl::StrCat("call", state.range(0)));
  auto ledger = Ledger::OpenWriter(path, LedgerOptions::Of(0));
  if (!ledger.ok()) {
    state.SkipWithError(std::string(ledger.status().message()).c_str());
    return;
  }
  const std::vector<PlannedMicrobatch> work = {PlannedMicrobatch::Of("0", {{0, 0, 65536}})};
  using Clock = std::chrono::steady_clock;
  double begin_us = 0, started_us = 0, completed_us = 0, commit_us = 0;
  auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  // Warm-up, untimed: the first step compiles the ledger's statements.
  int64_t step = 0;
  auto run_step = [&](Clock::time_point* t) {
    Ledger& l = **ledger;
    auto record = [&](LedgerEventKind kind) {
      LedgerEvent event = LedgerEvent::Of(kind, step, "0", work[0].ranges);
      return queued ? l.QueueRecord(std::move(event)).ok() : l.Record(event).ok();
    };
    t[0] = Clock::now();
    bool ok = (queued ? l.QueueBeginStep(step, work) : l.BeginStep(step, work)).ok();
    t[1] = Clock::now();
    ok = ok && record(LedgerEventKind::kStarted);
    t[2] = Clock::now();
    ok = ok && record(LedgerEventKind::kCompleted);
    t[3] = Clock::now();
    ok = ok && (queued ? l.QueueCommitStep(step) : l.CommitStep(step, "", sync)).ok();
    t[4] = Clock::now();
    if (queued) ok = ok && l.AwaitDurable().ok();
    ++step;
    return ok;
  };
  Clock::time_point t[5];
  if (!run_step(t)) {
    state.SkipWithError("a ledger operation failed");
    return;
  }
  int64_t timed = 0;
  for (auto _ : state) {
    const bool ok = run_step(t);
    if (!ok) {
      state.SkipWithError("a ledger operation failed");
      return;
    }
    begin_us += us(t[0], t[1]);
    started_us += us(t[1], t[2]);
    completed_us += us(t[2], t[3]);
    commit_us += us(t[3], t[4]);
    ++timed;
  }
  const double n = static_cast<double>(std::max<int64_t>(timed, 1));
  state.counters["begin_us"] = begin_us / n;
  state.counters["started_us"] = started_us / n;
  state.counters["completed_us"] = completed_us / n;
  state.counters["commit_us"] = commit_us / n;
  ledger->reset();
  RemoveLedgerFiles(path);
}
BENCHMARK(BM_LedgerCallOfOneMicrobatch)
    ->ArgName("mode")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// AdmitWaves over a plan of 10,000 microbatches (one or two sequences each, CP 2).
void BM_AdmitWaves10k(benchmark::State& state) {
  std::vector<planner::Sequence> batch;
  for (int i = 0; i < 11667; ++i) batch.push_back(planner::Sequence::Of(1024 + (i % 7) * 128, i));
  planner::PlanOptions options;
  options.max_tokens_per_microbatch = 2560;
  options.cp_size = 2;
  options.packing = planner::PACKING_IN_ORDER;
  auto plan = planner::PlanMicrobatches(batch, options);
  auto model = MemoryModel::Of(4e9, 2e5, 30);
  if (!plan.ok() || !model.ok()) {
    state.SkipWithError("planning failed");
    return;
  }
  state.counters["microbatches"] = plan->microbatches_size();
  for (auto _ : state) {
    auto admitted = AdmitWaves(*plan, *model, int64_t{80} << 30, AdmissionOptions());
    if (!admitted.ok()) {
      state.SkipWithError(std::string(admitted.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(admitted->waves.size());
  }
}
BENCHMARK(BM_AdmitWaves10k)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace admission
}  // namespace lockstep

// A run skipped with an error makes the binary exit non-zero (after saying why on stderr).
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  lockstep::benchmarking::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return reporter.all_measured() ? 0 : 1;
}
