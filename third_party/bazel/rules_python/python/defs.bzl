"""Offline stand-in for rules_python: forwards to Bazel's native Python rules."""

def py_binary(**kwargs):
    native.py_binary(**kwargs)

def py_library(**kwargs):
    native.py_library(**kwargs)

def py_runtime(**kwargs):
    native.py_runtime(**kwargs)

def py_runtime_pair(**kwargs):
    native.py_runtime_pair(**kwargs)

def py_test(**kwargs):
    native.py_test(**kwargs)
