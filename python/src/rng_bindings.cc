// lockstep._C's RNG part: RankStreams, the model-stream scope and named-stream forks (as handles
// the Python context managers of lockstep/rng.py open and close), Synchronize, the resume state
// as bytes, and the partition-invariant Philox draws.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "python/src/bindings.h"
#include "python/src/status.h"
#include "rng/generators.h"
#include "rng/model_stream.h"
#include "rng/named_streams.h"
#include "rng/philox.h"
#include "rng/rank_streams.h"
#include "rng/resume_state.h"
#include "rng/synchronize.h"
#include "torch/csrc/utils/pybind.h"

namespace lockstep {
namespace python {
namespace {

namespace py = pybind11;

// A `with` block's region, opened by __enter__ and closed by __exit__ (also when the block
// raises), written in C++ so that a scope from Python costs two calls and no generator frame.
// Holds the streams, so they outlive the region.
// The blocks of every kind open on each RankStreams, counted under the GIL.
std::unordered_map<const rng::RankStreams*, int>& OpenBlocks() {
  static auto* open = new std::unordered_map<const rng::RankStreams*, int>();
  return *open;
}

template <typename Region>
class RegionContext {
 public:
  using Open = std::function<absl::StatusOr<Region>(rng::RankStreams&)>;
  // pybind11 passes None as an empty pointer: refused here, for every region, before a block
  // could dereference it.
  RegionContext(std::shared_ptr<rng::RankStreams> streams, Open open)
      : streams_(std::move(streams)), open_(std::move(open)) {
    if (streams_ == nullptr) {
      throw py::type_error("streams must be a lockstep.rng.RankStreams, not None");
    }
  }
  // A block dropped while open (entered, never exited) no longer counts: the blocks around it
  // can still exit. Its region restores what it put aside as it goes.
  ~RegionContext() {
    if (!region_.has_value() || streams_ == nullptr) return;
    auto open = OpenBlocks().find(streams_.get());
    if (open != OpenBlocks().end() && --open->second <= 0) OpenBlocks().erase(open);
  }
  // Moved only before its block opens (pybind's factory), when there is no count to carry.
  RegionContext(RegionContext&&) = default;

  std::shared_ptr<rng::RankStreams> Enter() {
    if (region_.has_value()) Raise(absl::FailedPreconditionError("the block is open already"));
    region_.emplace(ValueOrThrow(open_(*streams_)));
    depth_ = ++OpenBlocks()[streams_.get()];
    return streams_;
  }
  bool Exit(const py::args&) {
    if (!region_.has_value()) Raise(absl::FailedPreconditionError("the block is not open"));
    // Note [Blocks exit in order]: each block puts aside the state the block around it left;
    // leaving an outer block while an inner one is open would restore that state under the inner
    // one, and the inner one's exit would then put the outer stream's state back as the caller's.
    // C++ scopes are nested by the language; Python's __exit__ can be called in any order.
    const int open = OpenBlocks()[streams_.get()];
    if (depth_ != open) {
      Raise(absl::FailedPreconditionError(absl::StrCat(
          "RNG blocks exited out of order: this block was opened at depth ", depth_, " and ",
          open - depth_, " block(s) opened inside it are still open; exit those first (nothing ",
          "was changed)")));
    }
    if (--OpenBlocks()[streams_.get()] == 0) OpenBlocks().erase(streams_.get());
    const absl::Status status = region_->Exit();
    region_.reset();
    ThrowIfError(status);
    return false;  // an exception from the block propagates
  }

 private:
  std::shared_ptr<rng::RankStreams> streams_;
  Open open_;
  std::optional<Region> region_;
  int depth_ = 0;  // this block's depth among those open on streams_, from 1
};

using ModelStreamContext = RegionContext<rng::ModelStreamScope>;
using NamedStreamContext = RegionContext<rng::NamedStreamFork>;

std::vector<rng::Slice> ToBox(const std::vector<std::pair<int64_t, int64_t>>& box) {
  std::vector<rng::Slice> slices;
  for (const auto& [begin, end] : box) slices.push_back(rng::Slice{begin, end});
  return slices;
}

rng::PhiloxKey Key(uint64_t seed, uint32_t stream, uint32_t step) {
  return rng::PhiloxKey::Of(seed, stream, step);
}

}  // namespace

void BindRng(py::module_& m) {
  py::class_<rng::RankStreams, std::shared_ptr<rng::RankStreams>>(m, "RankStreams")
      .def(py::init([](int cuda_device) {
             return ValueOrThrow(rng::RankStreams::Create(
                 cuda_device < 0 ? rng::DefaultGenerators::CpuOnly()
                                 : rng::DefaultGenerators::WithCudaDevice(cuda_device)));
           }),
           py::arg("cuda_device") = -1)
      .def_property_readonly("cuda_device",
                             [](const rng::RankStreams& s) { return s.generators().cuda_device; })
      .def_property_readonly("caller_state_live", &rng::RankStreams::caller_state_live)
      .def_property_readonly("in_model_stream",
                             [](const rng::RankStreams& s) { return s.model().in_scope(); })
      .def_property_readonly(
          "model_stream_started",
          [](const rng::RankStreams& s) { return s.model().state().has_value(); })
      .def(
          "add_named_stream",
          [](rng::RankStreams& s, const std::string& name, uint64_t seed) {
            ThrowIfError(s.named().Add(name, seed));
          },
          py::arg("name"), py::arg("seed"))
      .def_property_readonly("named_streams",
                             [](const rng::RankStreams& s) { return s.named().Names(); });

  py::class_<ModelStreamContext>(m, "model_stream",
                                 "model_stream(streams): a `with` block on the model stream.")
      .def(py::init([](std::shared_ptr<rng::RankStreams> streams) {
             return ModelStreamContext(std::move(streams), [](rng::RankStreams& s) {
               return rng::ModelStreamScope::Enter(s);
             });
           }),
           py::arg("streams"))
      .def("__enter__", &ModelStreamContext::Enter)
      .def("__exit__", &ModelStreamContext::Exit);
  py::class_<NamedStreamContext>(m, "named_stream",
                                 "named_stream(streams, name): a `with` block on a named stream.")
      .def(py::init([](std::shared_ptr<rng::RankStreams> streams, const std::string& name) {
             return NamedStreamContext(
                 std::move(streams), [name](rng::RankStreams& s) { return s.named().Fork(name); });
           }),
           py::arg("streams"), py::arg("name"))
      .def("__enter__", &NamedStreamContext::Enter)
      .def("__exit__", &NamedStreamContext::Exit);

  m.def(
      "_synchronize",
      [](collectives::Communicator* group, const rng::RankStreams& streams) {
        ThrowIfError(Released([&] { return rng::Synchronize(group, streams); }));
      },
      py::arg("group").none(true), py::arg("streams"));

  // The benchmark's C++ side of the binding overhead (python/bench/handback_benchmark.py): the
  // median time of one model-stream scope entered and exited from C++, over `iterations`.
  m.def("_time_model_stream_scope_ns", [](rng::RankStreams& streams, int iterations) {
    std::vector<int64_t> times;
    for (int i = 0; i < iterations; ++i) {
      const auto start = std::chrono::steady_clock::now();
      rng::ModelStreamScope scope = ValueOrThrow(rng::ModelStreamScope::Enter(streams));
      ThrowIfError(scope.Exit());
      times.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
    if (times.empty()) Raise(absl::InvalidArgumentError("iterations must be positive"));
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    return times[times.size() / 2];
  });

  m.def("capture_resume_state", [](const rng::RankStreams& streams) {
    return py::bytes(
        ValueOrThrow(rng::SerializeResumeState(ValueOrThrow(rng::CaptureResumeState(streams)))));
  });
  m.def("restore_resume_state", [](rng::RankStreams& streams, const py::bytes& saved) {
    const rng::RngResumeStateProto state =
        ValueOrThrow(rng::ParseResumeState(static_cast<std::string>(saved)));
    ThrowIfError(rng::RestoreResumeState(state, streams));
  });

  m.def(
      "partitioned_uniform",
      [](uint64_t seed, uint32_t stream, uint32_t step, const std::vector<int64_t>& global_shape,
         const std::vector<std::pair<int64_t, int64_t>>& box, c10::Device device) {
        return ValueOrThrow(
            rng::PartitionedUniform(Key(seed, stream, step), global_shape, ToBox(box), device));
      },
      py::arg("seed"), py::arg("stream"), py::arg("step"), py::arg("global_shape"), py::arg("box"),
      py::arg("device"));
  m.def(
      "partitioned_dropout_mask",
      [](uint64_t seed, uint32_t stream, uint32_t step, const std::vector<int64_t>& global_shape,
         const std::vector<std::pair<int64_t, int64_t>>& box, double p, c10::Device device) {
        return ValueOrThrow(rng::PartitionedDropoutMask(Key(seed, stream, step), global_shape,
                                                        ToBox(box), p, device));
      },
      py::arg("seed"), py::arg("stream"), py::arg("step"), py::arg("global_shape"), py::arg("box"),
      py::arg("p"), py::arg("device"));
  m.def(
      "partitioned_dropout",
      [](const at::Tensor& shard, uint64_t seed, uint32_t stream, uint32_t step,
         const std::vector<int64_t>& global_shape,
         const std::vector<std::pair<int64_t, int64_t>>& box, double p) {
        return ValueOrThrow(
            rng::PartitionedDropout(shard, Key(seed, stream, step), global_shape, ToBox(box), p));
      },
      py::arg("shard"), py::arg("seed"), py::arg("stream"), py::arg("step"),
      py::arg("global_shape"), py::arg("box"), py::arg("p"));
}

}  // namespace python
}  // namespace lockstep
