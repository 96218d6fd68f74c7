// SPDX-License-Identifier: MIT
// ELF tables handed from one process to another (src/elf/elf_tables.cpp:
// uprobe::export_elf_tables(), uprobe::import_elf_tables()): what a fork
// child (whose image cache starts empty: fork_fresh()) imports is, field by
// field, what this process read from the files; a file changed since is not
// taken; a truncated or damaged file gives nothing and changes nothing.
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "code_refs.hpp"
#include "elf_image.hpp"
#include "uprobe/uprobe.hpp"
#include "uprobe/symbols.hpp"

namespace {

using uprobe::detail::ElfImage;
using uprobe::detail::ImageDepth;

std::string real(const char* p) {
  char buf[PATH_MAX];
  return ::realpath(p, buf) ? std::string(buf) : std::string();
}

/// A directory of its own for a test's files, removed after it (in memory
/// where /dev/shm is there: AMalformedFileGivesNothing rewrites its file
/// ~10,000 times, ~3 ms each on a busy disk).
struct TempDir {
  std::string path;
  TempDir() {
    char shm[] = "/dev/shm/elf_tables_test.XXXXXX";
    char t[] = "/tmp/elf_tables_test.XXXXXX";
    path = ::mkdtemp(shm) ? shm : ::mkdtemp(t) ? t : "";
  }
  ~TempDir() {
    if (!path.empty()) std::system(("rm -rf '" + path + "'").c_str());
  }
};

/// Runs `body` in a fork child (its image cache empty); the child's gtest
/// failures fail the test (their messages are on standard output).
template <class F>
void in_child(F body) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    body();
    ::_exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks failed (its output above)";
}

/// Every field of two images of one file, equal (serial and elf_handles
/// aside: this process's own).
void expect_same(const ElfImage& a, const ElfImage& b, const std::string& what) {
  EXPECT_EQ(a.dev, b.dev) << what;
  EXPECT_EQ(a.ino, b.ino) << what;
  EXPECT_EQ(a.type, b.type) << what;
  EXPECT_EQ(a.build_id, b.build_id) << what;
  ASSERT_EQ(a.loads.size(), b.loads.size()) << what;
  for (std::size_t i = 0; i < a.loads.size(); ++i) {
    const auto &x = a.loads[i], &y = b.loads[i];
    EXPECT_EQ(std::tie(x.offset, x.vaddr, x.filesz, x.memsz, x.flags), std::tie(y.offset, y.vaddr, y.filesz, y.memsz, y.flags))
        << what << " load " << i;
  }
  ASSERT_EQ(a.symbols.size(), b.symbols.size()) << what;
  for (std::size_t i = 0; i < a.symbols.size(); ++i) {
    const auto &x = a.symbols[i], &y = b.symbols[i];
    ASSERT_EQ(x.name, y.name) << what << " symbol " << i;
    ASSERT_EQ(x.version, y.version) << what << " " << x.name;
    ASSERT_EQ(y.name.data()[y.name.size()], '\0') << what << " " << y.name << ": not NUL-terminated";
    ASSERT_EQ(std::tie(x.address, x.size, x.offset, x.type, x.binding, x.hidden_version, x.in_file, x.executable,
                       x.dynamic),
              std::tie(y.address, y.size, y.offset, y.type, y.binding, y.hidden_version, y.in_file, y.executable,
                       y.dynamic))
        << what << " " << x.name;
  }
  ASSERT_EQ(a.funcs.size(), b.funcs.size()) << what;
  ASSERT_EQ(a.reach, b.reach) << what;
  for (std::size_t i = 0; i < a.funcs.size(); ++i) {
    const auto &x = a.funcs[i], &y = b.funcs[i];
    ASSERT_EQ(std::tie(x.name, x.file_offset, x.size, x.source, x.symbol_index),
              std::tie(y.name, y.file_offset, y.size, y.source, y.symbol_index))
        << what << " function " << i;
    if (x.symbol_index != ~0u) {
      ASSERT_EQ(x.name.data(), a.symbols[x.symbol_index].name.data()) << what;
    }
  }
  EXPECT_EQ(a.fde_count, b.fde_count) << what;
  EXPECT_EQ(a.lsda_ranges, b.lsda_ranges) << what;
  EXPECT_EQ(std::tie(a.has_symtab, a.has_dynsym, a.debug_file, a.debug_deferred, a.deferred_debug_file,
                     a.deferred_build_id, a.soname, a.rpath, a.runpath, a.stapsdt_base, a.has_stapsdt_section,
                     a.malformed_notes),
            std::tie(b.has_symtab, b.has_dynsym, b.debug_file, b.debug_deferred, b.deferred_debug_file,
                     b.deferred_build_id, b.soname, b.rpath, b.runpath, b.stapsdt_base, b.has_stapsdt_section,
                     b.malformed_notes))
      << what;
  ASSERT_EQ(a.notes.size(), b.notes.size()) << what;
  for (std::size_t i = 0; i < a.notes.size(); ++i) {
    const auto &x = a.notes[i], &y = b.notes[i];
    EXPECT_EQ(std::tie(x.pc, x.base, x.semaphore, x.provider, x.name, x.args),
              std::tie(y.pc, y.base, y.semaphore, y.provider, y.name, y.args))
        << what << " note " << i;
  }
}

/// Reads the images of libc (and, when its debug file is installed, its
/// debug file's bounds: debug_file_refines() at every function, and the
/// image with its symbols), of this test (its own .symtab) and of
/// python3.11 (USDT notes, semaphores) into this process's cache.
void read_here() {
  const std::string libc = real("/lib/x86_64-linux-gnu/libc.so.6");
  const auto c = uprobe::detail::load_elf_image(libc, ImageDepth::file_tables);
  for (const auto& f : c->funcs)
    if (c->debug_deferred) uprobe::detail::debug_file_refines(*c, f, f.file_offset);
  if (c->debug_deferred) uprobe::detail::load_elf_image(libc, ImageDepth::with_debug_file);
  uprobe::detail::load_elf_image(real("/proc/self/exe"), ImageDepth::file_tables);
  if (::access("/usr/bin/python3.11", R_OK) == 0)
    uprobe::detail::load_elf_image(real("/usr/bin/python3.11"), ImageDepth::file_tables);
}

}  // namespace

// What a fresh process imports is what this one read, image by image and
// field by field, and it is what its resolutions then use: the cache holds
// the imported images (no file is read again), and debug_file_refines()
// answers from the imported bounds as from the ones read here.
TEST(ElfTables, AnImportedImageEqualsTheOneReadFromTheFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  in_child([&] {  // (a cache of its own)
    read_here();
    const auto here = uprobe::detail::cached_images();
    const std::string file = dir.path + "/tables";
    const std::size_t written = uprobe::export_elf_tables(file);
    EXPECT_EQ(written, here.size());
    EXPECT_GE(written, 2u);
    EXPECT_NE(::access((file + ".tmp").c_str(), F_OK), 0) << "the temporary file is renamed";
    in_child([&] {
      EXPECT_TRUE(uprobe::detail::cached_images().empty());
      EXPECT_EQ(uprobe::import_elf_tables(file), written);
      const auto mine = uprobe::detail::cached_images();
      ASSERT_EQ(mine.size(), here.size());
      for (const auto& h : here) {
        const std::string what = h.path + " (depths " + std::to_string(h.depths) + ")";
        const uprobe::detail::CachedImage* m = nullptr;
        for (const auto& c : mine) {
          if (c.path == h.path && c.depths == h.depths) m = &c;
        }
        ASSERT_NE(m, nullptr) << what << ": not imported";
        EXPECT_TRUE(m->id == h.id) << what;
        expect_same(*h.image, *m->image, what);
        // What a resolution here is answered with: the imported image.
        for (ImageDepth d : {ImageDepth::file_tables, ImageDepth::with_debug_file}) {
          if (!(h.depths & (1u << static_cast<unsigned>(d)))) continue;
          const auto answer = uprobe::detail::load_elf_image(h.path, d);  // (the deeper one, when both are cached)
          bool imported = false;
          for (const auto& c : mine) imported = imported || c.image == answer;
          EXPECT_TRUE(imported) << what << ": read again";
        }
        if (!m->image->debug_deferred) continue;
        bool ok = false;
        std::vector<std::pair<std::uint64_t, std::uint64_t>> bounds;
        EXPECT_TRUE(uprobe::detail::cached_debug_bounds(*m->image, ok, bounds)) << what << ": no debug bounds imported";
        EXPECT_TRUE(ok) << what;
        for (std::size_t i = 0; i < m->image->funcs.size(); ++i) {
          const auto &f = m->image->funcs[i], &g = h.image->funcs[i];
          for (std::uint64_t off : {f.file_offset, f.file_offset + f.size / 2}) {
            const bool a = uprobe::detail::debug_file_refines(*m->image, f, off);
            ASSERT_EQ(a, uprobe::detail::debug_file_refines(*h.image, g, off)) << what << " " << f.display_name();
          }
        }
      }
    });
    // A second import in one process takes nothing: its tables are there.
    in_child([&] {
      EXPECT_EQ(uprobe::import_elf_tables(file), written);
      EXPECT_EQ(uprobe::import_elf_tables(file), 0u);
    });
  });
}

namespace {

bool is_relative(std::uint32_t type) { return type == R_X86_64_RELATIVE; }

/// What a process that reads libc itself answers, for the fresh process
/// below to compare with: debug_file_refines() at the start and the middle
/// of every function (a '0' or '1' each), then the number of code
/// addresses its data stores (data_code_refs(), or why none: Debian 12's
/// libc has SHT_RELR relocations, found with libelf).
std::string libc_answers(const ElfImage& img, const std::string& path) {
  std::string out;
  for (const auto& f : img.funcs)
    for (std::uint64_t off : {f.file_offset, f.file_offset + f.size / 2})
      out += img.debug_deferred && uprobe::detail::debug_file_refines(img, f, off) ? '1' : '0';
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::string why;
  const auto refs = uprobe::detail::data_code_refs(fd, path, img, is_relative, why);
  ::close(fd);
  return out + " " + (refs ? std::to_string(refs->size()) : "none: " + why);
}

}  // namespace

// The importing process's own side, run by the test below in a process of
// its own (this program exec'd again, with ELF_TABLES_FILE and
// ELF_TABLES_EXPECT set; disabled in a plain run): one that has read no ELF file before it imports,
// as uprobe-trace's agent. What it answers from the imported tables, and
// what it reads beside them (the debug file's bounds when they were not
// exported, the code addresses libc's data stores), is what a process that
// read libc itself answers.
TEST(ElfTablesFresh, DISABLED_Import) {
  const char* file = std::getenv("ELF_TABLES_FILE");
  const char* expect = std::getenv("ELF_TABLES_EXPECT");
  if (!file || !expect) GTEST_SKIP() << "run by ElfTables.AFreshProcessAnswersAsOneThatReadTheFiles";
  ASSERT_EQ(uprobe::import_elf_tables(file), 1u);
  const auto cached = uprobe::detail::cached_images();
  ASSERT_EQ(cached.size(), 1u);
  const std::string libc = real("/lib/x86_64-linux-gnu/libc.so.6");
  const auto img = uprobe::detail::load_elf_image(libc, ImageDepth::file_tables);
  ASSERT_EQ(img, cached[0].image) << "read again";
  std::ifstream in(expect);
  const std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string got = libc_answers(*img, libc);
  const auto diff = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
  EXPECT_TRUE(got == want) << "first difference at " << diff.first - got.begin() << " of " << want.size()
                           << "; here: ..." << got.substr(static_cast<std::size_t>(diff.first - got.begin()), 80)
                           << "; read: ..." << want.substr(static_cast<std::size_t>(diff.second - want.begin()), 80);
  if (img->debug_deferred) {
    bool ok = false;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> bounds;
    ASSERT_TRUE(uprobe::detail::cached_debug_bounds(*img, ok, bounds));
    EXPECT_TRUE(ok) << "the debug file's bounds could not be read here";
  }
}

TEST(ElfTables, AFreshProcessAnswersAsOneThatReadTheFiles) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string libc = real("/lib/x86_64-linux-gnu/libc.so.6");
  in_child([&] {
    const auto img = uprobe::detail::load_elf_image(libc, ImageDepth::file_tables);
    // (The export reads the debug file's bounds, which no check here asked
    // for yet: the importer reads none.)
    ASSERT_EQ(uprobe::export_elf_tables(dir.path + "/tables"), 1u);
    const std::string want = libc_answers(*img, libc);
    std::ofstream(dir.path + "/expect") << want;
    EXPECT_NE(want.find('0'), std::string::npos);
  });
  for (const char* which : {"/tables"}) {
    const std::string cmd = "ELF_TABLES_FILE='" + dir.path + which + "' ELF_TABLES_EXPECT='" + dir.path +
                            "/expect' '" + real("/proc/self/exe") + "' --gtest_also_run_disabled_tests --gtest_filter=ElfTablesFresh.DISABLED_Import >" + dir.path +
                            "/out 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(dir.path + "/out");
    const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(status, 0) << which << ":\n" << out;
    EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << which << ":\n" << out;
  }
}

// An image of a file changed since it was read (here its modification
// time) is not taken: the reader reads the file itself; the others are.
TEST(ElfTables, AFileChangedSinceIsNotTaken) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string copy = dir.path + "/true-copy";
  {
    std::ifstream in(real("/bin/true"), std::ios::binary);
    std::ofstream out(copy, std::ios::binary);
    out << in.rdbuf();
    ASSERT_TRUE(out.good());
  }
  const std::string libc = real("/lib/x86_64-linux-gnu/libc.so.6");
  in_child([&] {
    const auto before = uprobe::detail::load_elf_image(copy, ImageDepth::file_tables);
    uprobe::detail::load_elf_image(libc, ImageDepth::file_tables);
    const std::string file = dir.path + "/tables";
    ASSERT_EQ(uprobe::export_elf_tables(file), 2u);
    const timespec times[2] = {{0, UTIME_OMIT}, {1'000'000'000, 0}};  // (mtime 2001)
    ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
    in_child([&] {
      EXPECT_EQ(uprobe::import_elf_tables(file), 1u);
      const auto cached = uprobe::detail::cached_images();
      ASSERT_EQ(cached.size(), 1u);
      EXPECT_EQ(cached[0].path, libc);
      const auto now = uprobe::detail::load_elf_image(copy, ImageDepth::file_tables);
      expect_same(*before, *now, copy + " read again");
      EXPECT_EQ(uprobe::detail::cached_images().size(), 2u);
    });
  });
}

// A file cut anywhere, or with a byte past its end, or of another format
// version, gives nothing at all (and takes nothing into the cache); one
// with any 8-byte word made huge (a count, a length, an offset) or any byte
// changed is read without a fault or a huge allocation (under the
// sanitizers too), whatever it then gives. A missing file, a directory:
// nothing.
TEST(ElfTables, AMalformedFileGivesNothing) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string file = dir.path + "/tables";
  in_child([&] {
    uprobe::detail::load_elf_image(real("/bin/true"), ImageDepth::file_tables);
    ASSERT_EQ(uprobe::export_elf_tables(file), 1u);
  });
  std::ifstream in(file, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(good.size(), 1000u);
  const std::string bad = dir.path + "/bad";
  auto write_bad = [&](const std::string& bytes) {
    std::ofstream out(bad, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  };
  in_child([&] {
    EXPECT_EQ(uprobe::import_elf_tables(dir.path + "/missing"), 0u);
    EXPECT_EQ(uprobe::import_elf_tables(dir.path), 0u);
    for (std::size_t n = 0; n < good.size(); ++n) {
      write_bad(good.substr(0, n));
      ASSERT_EQ(uprobe::import_elf_tables(bad), 0u) << "cut at " << n << " of " << good.size();
    }
    write_bad(good + "x");
    EXPECT_EQ(uprobe::import_elf_tables(bad), 0u) << "a byte past the end";
    std::string v1 = good;
    v1[8] = 1;  // (the format version: 1, without the debug file's identity)
    write_bad(v1);
    EXPECT_EQ(uprobe::import_elf_tables(bad), 0u) << "another format version";
    EXPECT_TRUE(uprobe::detail::cached_images().empty());
    for (std::size_t at = 0; at + 8 <= good.size(); ++at) {
      std::string w = good;
      const std::uint64_t huge = 0xfffffffffffffff0ull;
      std::memcpy(w.data() + at, &huge, 8);
      write_bad(w);
      ASSERT_EQ(uprobe::import_elf_tables(bad), 0u) << "a word at " << at << " made huge";
    }
    // (A damaged byte anywhere: the file's hash no longer matches.)
    std::mt19937 rng(20261203);
    for (int i = 0; i < 2000; ++i) {
      std::string w = good;
      const std::size_t at = rng() % w.size();
      w[at] ^= static_cast<char>(1 + rng() % 255);
      write_bad(w);
      ASSERT_EQ(uprobe::import_elf_tables(bad), 0u) << "a byte flipped at " << at;
    }
    EXPECT_TRUE(uprobe::detail::cached_images().empty());
    // A FIFO in the file's place is not waited on (nothing writes to it).
    ::unlink(bad.c_str());
    ASSERT_EQ(::mkfifo(bad.c_str(), 0600), 0);
    EXPECT_EQ(uprobe::import_elf_tables(bad), 0u);
    ::unlink(bad.c_str());
  });
  in_child([&] {
    // Nothing of a refused file is taken: the cache is as it was.
    write_bad(good.substr(0, good.size() - 1));
    EXPECT_EQ(uprobe::import_elf_tables(bad), 0u);
    EXPECT_TRUE(uprobe::detail::cached_images().empty());
    EXPECT_EQ(uprobe::import_elf_tables(file), 1u);
  });
}

// An image of a file without a .symtab is taken only beside the debug file
// it was read beside (by its build-id: the same identity, or still none):
// uprobe-trace keeps these files between runs, and a debug file installed,
// replaced or removed since changes what the image answers.
TEST(ElfTables, AnImageIsTakenOnlyBesideTheSameDebugFile) {
  const std::string lib = std::string(DEPTH_COMPAT_DIR) + "/libusdtfix_depth_compat_stripped.so";
  const std::string debug = std::string(DEPTH_COMPAT_DIR) + "/libusdtfix_depth_compat.debug";
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  std::string id;
  in_child([&] { ASSERT_FALSE(uprobe::detail::load_elf_image(lib, ImageDepth::file_tables)->build_id.empty()); });
  {
    auto img = uprobe::detail::load_elf_image(lib, ImageDepth::file_tables);
    id = img->build_id;
  }
  ASSERT_GT(id.size(), 2u);
  const std::string ddir = "/usr/lib/debug/.build-id/" + id.substr(0, 2);
  const std::string dbg = ddir + "/" + id.substr(2) + ".debug";
  if (::access("/usr/lib/debug", W_OK) != 0) GTEST_SKIP() << "installing a debug file under /usr/lib/debug needs root";
  ::unlink(dbg.c_str());
  const std::string none = dir.path + "/none", beside = dir.path + "/beside";
  in_child([&] {
    EXPECT_FALSE(uprobe::detail::load_elf_image(lib, ImageDepth::file_tables)->debug_deferred);
    ASSERT_EQ(uprobe::export_elf_tables(none), 1u);
  });
  in_child([&] { EXPECT_EQ(uprobe::import_elf_tables(none), 1u) << "nothing changed"; });
  ::mkdir("/usr/lib/debug/.build-id", 0755);
  ::mkdir(ddir.c_str(), 0755);
  ASSERT_EQ(std::system(("cp '" + debug + "' '" + dbg + "'").c_str()), 0);
  in_child([&] {
    EXPECT_EQ(uprobe::import_elf_tables(none), 0u) << "a debug file installed since";
    EXPECT_TRUE(uprobe::detail::cached_images().empty());
    const auto img = uprobe::detail::load_elf_image(lib, ImageDepth::file_tables);
    EXPECT_TRUE(img->debug_deferred);
    EXPECT_EQ(img->deferred_build_id, id);
    ASSERT_EQ(uprobe::export_elf_tables(beside), 1u);
  });
  in_child([&] {
    ASSERT_EQ(uprobe::import_elf_tables(beside), 1u) << "beside the same debug file";
    const auto img = uprobe::detail::load_elf_image(lib, ImageDepth::file_tables);
    EXPECT_TRUE(img->debug_deferred);
    EXPECT_EQ(img->build_id, id);
    EXPECT_EQ(img->deferred_debug_file, dbg);
  });
  // The debug file written again (a new ctime), then gone.
  ASSERT_EQ(std::system(("cp '" + debug + "' '" + dbg + ".new' && mv '" + dbg + ".new' '" + dbg + "'").c_str()), 0);
  in_child([&] { EXPECT_EQ(uprobe::import_elf_tables(beside), 0u) << "another debug file by the same build-id"; });
  ::unlink(dbg.c_str());
  ::rmdir(ddir.c_str());
  in_child([&] {
    EXPECT_EQ(uprobe::import_elf_tables(beside), 0u) << "the debug file removed since";
    EXPECT_EQ(uprobe::import_elf_tables(none), 1u) << "none again";
  });
}

// For tables kept long (uprobe-trace keeps them between runs), only files
// unchanged for the last 3 seconds are written (settled_only): a file
// rewritten within its filesystem's timestamp resolution of being read could
// keep the identity it was read with.
TEST(ElfTables, SettledOnlyLeavesOutAFileChangedJustNow) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string copy = dir.path + "/true_copy";
  ASSERT_EQ(std::system(("cp /bin/true '" + copy + "'").c_str()), 0);
  in_child([&] {
    uprobe::detail::load_elf_image(copy, ImageDepth::file_tables);
    uprobe::detail::load_elf_image(real("/bin/true"), ImageDepth::file_tables);
    EXPECT_EQ(uprobe::export_elf_tables(dir.path + "/all"), 2u);
    EXPECT_EQ(uprobe::export_elf_tables(dir.path + "/settled", true), 1u) << "the copy was made just now";
  });
  in_child([&] {
    EXPECT_EQ(uprobe::import_elf_tables(dir.path + "/settled"), 1u);
    EXPECT_EQ(uprobe::detail::cached_images().at(0).path, real("/bin/true"));
  });
  ::sleep(4);
  in_child([&] {
    uprobe::detail::load_elf_image(copy, ImageDepth::file_tables);
    EXPECT_EQ(uprobe::export_elf_tables(dir.path + "/later", true), 1u) << "4 s later";
  });
}

// Only the files asked for are written (compared by device and inode: a
// path that is another name of the same file names it; one that does not
// exist names none), and of libc's debug-file bounds only those that can
// change debug_file_refines()'s answer about one of libc's own functions
// (an exact twin of every such function holding it never does): fewer than
// a tenth of what the debug file has, and the importer answers as the
// reader at the start, the middle and the last byte of every function.
TEST(ElfTables, OnlyTheNamedFilesAndTheDebugBoundsThatRefineAreWritten) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const std::string libc = real("/lib/x86_64-linux-gnu/libc.so.6");
  const std::string libc_link = dir.path + "/libc-link.so.6";
  ASSERT_EQ(::symlink(libc.c_str(), libc_link.c_str()), 0);
  in_child([&] {
    const auto img = uprobe::detail::load_elf_image(libc, ImageDepth::file_tables);
    uprobe::detail::load_elf_image(real("/bin/true"), ImageDepth::file_tables);
    uprobe::detail::load_elf_image(real("/proc/self/exe"), ImageDepth::file_tables);
    std::string want;
    for (const auto& f : img->funcs)
      for (std::uint64_t off : {f.file_offset, f.file_offset + f.size / 2, f.file_offset + (f.size ? f.size - 1 : 0)})
        want += img->debug_deferred && uprobe::detail::debug_file_refines(*img, f, off) ? '1' : '0';
    bool ok = false;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> all;
    if (img->debug_deferred) {
      ASSERT_TRUE(uprobe::detail::cached_debug_bounds(*img, ok, all));
    }
    EXPECT_EQ(uprobe::export_elf_tables(dir.path + "/libc", false, {libc_link, dir.path + "/none"}), 1u);
    EXPECT_EQ(uprobe::export_elf_tables(dir.path + "/two", false, {libc, real("/bin/true")}), 2u);
    EXPECT_EQ(uprobe::export_elf_tables(dir.path + "/none", false, {dir.path + "/none"}), 0u);
    EXPECT_EQ(uprobe::export_elf_tables(dir.path + "/all", false, {}), 3u) << "no files named: every file";
    in_child([&] {
      ASSERT_EQ(uprobe::import_elf_tables(dir.path + "/libc"), 1u);
      const auto cached = uprobe::detail::cached_images();
      ASSERT_EQ(cached.size(), 1u);
      EXPECT_EQ(cached[0].path, libc);
      const auto& mine = *cached[0].image;
      std::string got;
      for (const auto& f : mine.funcs)
        for (std::uint64_t off : {f.file_offset, f.file_offset + f.size / 2, f.file_offset + (f.size ? f.size - 1 : 0)})
          got += mine.debug_deferred && uprobe::detail::debug_file_refines(mine, f, off) ? '1' : '0';
      EXPECT_TRUE(got == want) << "the imported bounds answer otherwise";
      if (!mine.debug_deferred) return;  // (no libc6-dbg: no bounds to leave out)
      bool ok2 = false;
      std::vector<std::pair<std::uint64_t, std::uint64_t>> kept;
      ASSERT_TRUE(uprobe::detail::cached_debug_bounds(mine, ok2, kept));
      EXPECT_EQ(ok2, ok);
      EXPECT_LT(kept.size() * 10, all.size()) << kept.size() << " of " << all.size() << " written";
      for (const auto& b : kept)
        EXPECT_NE(std::find(all.begin(), all.end(), b), all.end()) << "a bound the debug file does not have";
    });
  });
}

// The file is written whole or not at all: a directory it cannot be
// created in is an error naming it, and leaves nothing behind; an existing
// file is replaced.
TEST(ElfTables, AnUnwritableFileIsAnErrorAndLeavesNothing) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  in_child([&] {
    uprobe::detail::load_elf_image(real("/bin/true"), ImageDepth::file_tables);
    const std::string file = dir.path + "/none/tables";
    try {
      uprobe::export_elf_tables(file);
      ADD_FAILURE() << "no error";
    } catch (const uprobe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(file + ".tmp"), std::string::npos) << e.what();
    }
    const std::string twice = dir.path + "/tables";
    EXPECT_EQ(uprobe::export_elf_tables(twice), 1u);
    EXPECT_EQ(uprobe::export_elf_tables(twice), 1u) << "an existing file is replaced";
    EXPECT_NE(::access((twice + ".tmp").c_str(), F_OK), 0);
    EXPECT_EQ(uprobe::import_elf_tables(twice), 0u) << "its own images: nothing taken";
  });
}
