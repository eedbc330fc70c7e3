#pragma once
// Records, for every kernel launched from Python, the code location that launched it
// (rt::Kernel::origin), so asynchronous kernel errors name the user's file and line.
#include <string>
#include <vector>

namespace neuronx {
// Frames in files under `library_dirs` (torch's and our package's) are skipped over: the
// origin is the innermost frame outside them. Called once, at import.
void install_op_origins(const std::vector<std::string>& library_dirs);
}  // namespace neuronx
