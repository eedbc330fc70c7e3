#include "runtime/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace neuronx::rt {

namespace {

std::string describe_mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// What is wrong with `dir` as an ancestor of a private directory ("" if nothing).
std::string check_ancestor(const std::string& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return dir + ": " + std::strerror(errno);
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return dir + " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
    return dir + " can be changed by other users (mode " + describe_mode(st.st_mode) + ", not sticky)";
  return "";
}

// The directories above `path` ("/a/b/c" -> "/a/b", "/a", "/").
std::vector<std::string> ancestors(const std::string& path) {
  std::vector<std::string> out;
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  for (size_t slash = p.rfind('/'); slash != std::string::npos && slash > 0; slash = p.rfind('/')) {
    p.resize(slash);
    out.push_back(p);
  }
  if (!path.empty() && path[0] == '/') out.push_back("/");
  return out;
}

}  // namespace

std::string private_directory(const std::string& path) {
  if (path.empty()) return "the path is empty";
  std::string cur = path[0] == '/' ? "/" : "";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) {
      cur += path.substr(start, end - start);
      if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST)
        return "cannot create " + cur + ": " + std::strerror(errno);
      cur += "/";
    }
    start = end + 1;
  }
  char real[PATH_MAX];
  if (!::realpath(path.c_str(), real)) return path + ": " + std::strerror(errno);
  struct stat st{};
  if (::stat(real, &st) != 0) return std::string(real) + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return std::string(real) + " is not a directory";
  if (st.st_uid != ::geteuid())
    return std::string(real) + " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return std::string(real) + " can be written by other users (mode " + describe_mode(st.st_mode) + ")";
  // Both the path as given (a symlink in it could be swapped) and where it leads.
  for (const std::string& base : {path, std::string(real)})
    for (const std::string& a : ancestors(base))
      if (std::string why = check_ancestor(a); !why.empty()) return why;
  return "";
}

bool private_file(const std::string& path) {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
         !(st.st_mode & (S_IWGRP | S_IWOTH));
}

bool write_private_file(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(path.c_str());
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return ::close(fd) == 0;
}

}  // namespace neuronx::rt
