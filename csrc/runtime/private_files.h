// Files only this user can change: where the runtime and the compiler keep what they load back
// (generated kernels, compiled graphs) or publish (telemetry). A directory another user can
// write to would let that user put code into this process.
#pragma once

#include <string>

namespace neuronx::rt {

// Creates `path` and its missing parents with mode 0700, then checks that it is fit to hold code
// this process loads: a directory owned by this user and writable by no one else, whose
// ancestors only this user or root can change (a world- or group-writable ancestor must be
// sticky, as /tmp is). Returns "" when it is, else what is wrong, in words.
std::string private_directory(const std::string& path);

// Whether the file at `path` is a regular file owned by this user that no one else can write.
bool private_file(const std::string& path);

// Writes `data` to a new file `path` (it must not exist) with mode 0600. False on failure.
bool write_private_file(const std::string& path, const std::string& data);

}  // namespace neuronx::rt
