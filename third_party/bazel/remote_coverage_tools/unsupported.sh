#!/bin/sh
echo "coverage is not supported in the offline lockstep build" >&2
exit 1
