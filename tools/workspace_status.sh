#!/usr/bin/env bash
# Bazel's workspace status (.bazelrc --workspace_status_command): the commit lockstep is built
# from, for the execution context evidence records (numerics/execution_context.h).
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $commit != unknown ]] && ! git diff --quiet HEAD 2>/dev/null; then commit="$commit+dirty"; fi
echo "STABLE_GIT_COMMIT $commit"
