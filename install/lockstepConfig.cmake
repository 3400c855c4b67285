# lockstep's CMake package (installed by `bazel run //install -- --prefix=PREFIX`).
#
#   find_package(Torch REQUIRED)      # the LibTorch lockstep was built against
#   find_package(lockstep 0.1 REQUIRED)
#   target_link_libraries(my_service PRIVATE lockstep::planner lockstep::rng)
#
# Imported targets: lockstep::base, lockstep::collectives, lockstep::planner, lockstep::rng,
# lockstep::checkpoint, lockstep::invariant, lockstep::numerics, lockstep::admission, lockstep::trainer,
# lockstep::replay (each the
# shared library of one module, linking the modules it uses), and lockstep::lockstep for all.
# lockstep's headers are included by their paths ("planner/planner.h"). Its dependencies are
# found the way Debian ships their CMake packages: Torch, absl and glog by their configs,
# protobuf by CMake's FindProtobuf.
include(CMakeFindDependencyMacro)
find_dependency(Torch)
find_dependency(absl)
find_dependency(glog)
find_dependency(Protobuf)
include("${CMAKE_CURRENT_LIST_DIR}/lockstepTargets.cmake")
