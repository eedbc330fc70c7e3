#pragma once
// Calls into the Python layer that the backend needs without including
// Python.h: set by the extension module at import (the layers never link
// against Python; see CMakeLists.txt).
namespace neuronx {
using VoidFn = void (*)();
void set_clear_python_error(VoidFn fn);
// Clears a pending Python exception left by a Python meta kernel we handled.
void clear_python_error();
}  // namespace neuronx
