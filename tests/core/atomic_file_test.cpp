// write_file_atomically: the new file replaces the old one whole; a writer that fails, a folder
// that cannot be written, leave the old file as it was and no temporary behind, with an error
// naming the file.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/atomic_file.h"
#include "core/error.h"
#include "test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;

size_t files_in(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

TEST(AtomicFile, ReplacesTheFileWholeAndLeavesNoTemporary) {
  testing::TempDir tmp;
  const fs::path p = tmp / "a.json";
  write_file_atomically(p, "first");
  EXPECT_EQ(testing::read_file(p), "first");
  write_file_atomically(p, std::string(1 << 20, 'x'), {.durable = true, .mode = 0640});
  EXPECT_EQ(testing::read_file(p).size(), size_t(1 << 20));
  EXPECT_EQ(fs::status(p).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_file_atomically(p, "fixed temporary name", {.per_process_tmp = false});
  EXPECT_EQ(testing::read_file(p), "fixed temporary name");
  EXPECT_EQ(files_in(tmp.path()), 1u);
}

TEST(AtomicFile, AFailedWriteKeepsTheOldFile) {
  testing::TempDir tmp;
  const fs::path p = tmp / "index.npy";
  write_file_atomically(p, "old");
  EXPECT_THROW(write_file_atomically(p,
                                     [](std::ostream& out) {
                                       out << "half of it";
                                       throw std::runtime_error("the writer failed");
                                     }),
               std::runtime_error);
  EXPECT_EQ(testing::read_file(p), "old");
  EXPECT_EQ(files_in(tmp.path()), 1u);
  try {
    write_file_atomically(tmp / "no" / "such" / "folder.txt", "x", {.hint = "check --output"});
    ADD_FAILURE() << "a write into a missing folder succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("folder.txt"), std::string::npos) << what;
    EXPECT_NE(what.find("check --output"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace megatron
