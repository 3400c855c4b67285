#!/bin/sh
# Debian's protoc (package protobuf-compiler), matching the libprotobuf the build links.
exec /usr/bin/protoc "$@"
