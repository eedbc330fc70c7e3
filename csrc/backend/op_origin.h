#pragma once
// Records, for every kernel launched from Python, the code location that launched it
// (rt::Kernel::origin), so asynchronous kernel errors name the user's file and line.
namespace neuronx {
// Installs the runtime's origin hooks unless TORCH_NEURONX_OP_ORIGINS=0. Frames in torch's and
// torch_neuronx's package directories are skipped over: the origin is the innermost frame
// outside them. Called once, at import, with the GIL held.
void install_op_origins();
}  // namespace neuronx
