// Private files: the directory checks that keep another user's files out of what the process
// loads (compile cache) and publishes (telemetry).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <fstream>
#include <string>

#include "runtime/private_files.h"

namespace rt = neuronx::rt;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/nx-private-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    if (!made) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    path = made;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

mode_t mode_of(const std::string& p) {
  struct stat st{};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

}  // namespace

TEST(PrivateFiles, MissingDirectoriesAreCreatedUserOnly) {
  TempDir t;
  const std::string leaf = t.path + "/a/b/c";
  EXPECT_EQ(rt::private_directory(leaf), "");
  for (const std::string& d : {t.path + "/a", t.path + "/a/b", leaf}) EXPECT_EQ(mode_of(d), 0700u) << d;
  EXPECT_EQ(rt::private_directory(leaf + "/"), "");  // a trailing slash names the same directory
}

TEST(PrivateFiles, ADirectoryOthersCanWriteIsRefused) {
  TempDir t;
  const std::string d = t.path + "/cache";
  ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(d.c_str(), 0770), 0);
  EXPECT_NE(rt::private_directory(d).find("can be written by other users (mode 0770)"), std::string::npos);
  ASSERT_EQ(::chmod(d.c_str(), 0755), 0);  // readable by others is fine: nothing in it can be changed
  EXPECT_EQ(rt::private_directory(d), "");
}

TEST(PrivateFiles, AnAncestorOthersCanChangeIsRefusedUnlessSticky) {
  TempDir t;
  const std::string shared = t.path + "/shared", d = shared + "/cache";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 0777), 0);
  const std::string why = rt::private_directory(d);
  EXPECT_NE(why.find(shared + " can be changed by other users (mode 0777, not sticky)"), std::string::npos) << why;
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);  // as /tmp: others cannot rename what is ours
  EXPECT_EQ(rt::private_directory(d), "");
}

TEST(PrivateFiles, ASymlinkIsJudgedByWhereItLeadsAndWhereItSits) {
  TempDir t;
  const std::string open_dir = t.path + "/open", link = t.path + "/link";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(::symlink(open_dir.c_str(), link.c_str()), 0);
  EXPECT_NE(rt::private_directory(link).find("can be written by other users"), std::string::npos);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0700), 0);
  EXPECT_EQ(rt::private_directory(link), "");
}

TEST(PrivateFiles, APathThatIsAFileIsRefused) {
  TempDir t;
  const std::string f = t.path + "/file";
  std::ofstream(f) << "x";
  EXPECT_NE(rt::private_directory(f), "");
}

TEST(PrivateFiles, FilesAreWrittenUserOnlyAndNeverOverAnExistingOne) {
  TempDir t;
  const std::string f = t.path + "/entry";
  ASSERT_TRUE(rt::write_private_file(f, "checksum"));
  EXPECT_EQ(mode_of(f), 0600u);
  EXPECT_TRUE(rt::private_file(f));
  EXPECT_FALSE(rt::write_private_file(f, "other"));  // O_EXCL: a planted file is not written through
  std::ifstream in(f);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "checksum");
  ASSERT_EQ(::chmod(f.c_str(), 0666), 0);
  EXPECT_FALSE(rt::private_file(f));
  const std::string link = t.path + "/link";
  ASSERT_EQ(::symlink(f.c_str(), link.c_str()), 0);
  EXPECT_FALSE(rt::private_file(link));  // (lstat: a link is not the file)
  EXPECT_FALSE(rt::private_file(t.path + "/missing"));
}
