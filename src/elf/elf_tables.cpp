// SPDX-License-Identifier: MIT
// The ELF tables of one process handed to another (symbols.hpp's
// export_elf_tables() and import_elf_tables()): the images of the image
// cache (elf_image.cpp) and the debug-file bounds debug_file_refines() read,
// written to a file field by field and read back into ElfImages that are put
// in the reader's cache, each only while its file is the one it was read
// from (device, inode, size, mtime, ctime: the cache's own key) and the
// debug file found by its build-id is the one it was read beside (the same
// identity, or still none): uprobe-trace keeps these files between runs too.
//
// uprobe-trace's CLI reads libc's tables to check the specs while the
// program starts; the agent in the program needs the same tables to attach,
// and reading them is most of its attach (~3-4 ms of page faults and
// parsing on a 2-vCPU VM). Reading them back from this file is a copy into
// memory populated in one call per table (MADV_POPULATE_WRITE: no page fault
// per page).
//
// Format (native byte order; a reader of another format version adopts
// nothing): "UPRBELFT", u32 version, u32 0, u64 image count; per image its
// byte length and then: identity (7 x u64), path, build_id, the identity of
// the debug file by that build-id (7 x u64, zeros: none), u32 depths, u32 type,
// u32 flags, stapsdt_base, fde_count, malformed_notes, debug_file,
// deferred_debug_file, deferred_build_id, soname, rpath[], runpath[],
// loads[], the string pool (each name NUL-terminated, as in a string table),
// symbols[] (names as pool offsets), funcs[]
// (names by symbol index), lsda_ranges[], notes[], the debug bounds; then
// "UPRBEND!", and a u64 hash of every byte before it (StreamHash: a kept
// file damaged on disk gives nothing, not a wrong table). Strings and arrays
// are a u64 count and their bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "debug_file.hpp"
#include "elf_image.hpp"
#include "populate.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe {

namespace {

using detail::CachedImage;
using detail::ElfImage;
using detail::ElfSymbol;
using detail::FileIdentity;
using detail::FuncSym;
using detail::populate_pages;

constexpr char kMagic[8] = {'U', 'P', 'R', 'B', 'E', 'L', 'F', 'T'};
constexpr char kEnd[8] = {'U', 'P', 'R', 'B', 'E', 'N', 'D', '!'};
constexpr std::uint32_t kVersion = 4;  // (4: StreamHash's four lanes)

/// A symbol as written: its name and version as offsets into the pool.
struct SymbolRecord {
  std::uint32_t name_off, name_len, version_off, version_len;
  std::uint64_t address, size, offset;
  std::uint8_t type, binding, flags, pad[5];
};
static_assert(sizeof(SymbolRecord) == 48 && std::is_trivially_copyable_v<SymbolRecord>);
constexpr std::uint8_t kHiddenVersion = 1, kInFile = 2, kExecutable = 4, kDynamic = 8;

/// A function's bounds as written: its name is its symbol's.
struct FuncRecord {
  std::uint64_t file_offset, size;
  std::uint32_t symbol_index;
  std::uint8_t source, pad[3];
};
static_assert(sizeof(FuncRecord) == 24 && std::is_trivially_copyable_v<FuncRecord>);

constexpr std::uint32_t kHasSymtab = 1, kHasDynsym = 2, kDebugDeferred = 4, kHasStapsdtSection = 8, kHasStapsdtBase = 16;

// ------------------------------------------------------------------ writing

/// A 64-bit hash of a byte stream, fed in pieces of any size, 8 bytes at a
/// time: word k goes through bijective steps into lane k mod 4, and the four
/// lanes and the length are mixed the same way at the end, so a change of any
/// one word always changes the result. Four independent chains: the import
/// hashes every byte of a kept file (libc's, 290 KB: ~73 us with one chain,
/// the multiply's latency each word, ~20 with four).
/// Not cryptographic: it tells a damaged file.
class StreamHash {
 public:
  void add(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    total_ += n;
    while (n > 0) {
      if (ntail_ == 0) {  // whole words straight from the input
        while (n >= 32 && (words_ & 3) == 0) {
          std::uint64_t w[4];
          std::memcpy(w, c, sizeof w);
          mix(h_[0], w[0]), mix(h_[1], w[1]), mix(h_[2], w[2]), mix(h_[3], w[3]);
          c += 32, n -= 32, words_ += 4;
        }
        for (; n >= 8; c += 8, n -= 8) word(load(c));
        if (n == 0) break;
      }
      const std::size_t take = std::min(n, sizeof tail_ - ntail_);
      std::memcpy(tail_ + ntail_, c, take);
      ntail_ += take, c += take, n -= take;
      if (ntail_ == sizeof tail_) word(load(tail_)), ntail_ = 0;
    }
  }
  std::uint64_t value() const {
    StreamHash h = *this;
    std::uint64_t w = 0;
    std::memcpy(&w, h.tail_, h.ntail_);
    h.word(w);
    std::uint64_t v = h.h_[0];
    mix(v, h.h_[1]), mix(v, h.h_[2]), mix(v, h.h_[3]), mix(v, total_);
    return v;
  }

 private:
  static std::uint64_t load(const unsigned char* c) {
    std::uint64_t w;
    std::memcpy(&w, c, sizeof w);
    return w;
  }
  static void mix(std::uint64_t& h, std::uint64_t w) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  void word(std::uint64_t w) { mix(h_[words_++ & 3], w); }
  std::uint64_t h_[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  std::uint64_t total_ = 0, words_ = 0;
  unsigned char tail_[8] = {};
  std::size_t ntail_ = 0;
};

/// Writes to a file descriptor through a small buffer (no copy of the whole
/// file in memory: fresh pages cost the CLI too), or with fd < 0 only
/// counts the bytes (the length of an image's record, written before it).
class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) {}
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof v);
  }
  void bytes(const void* p, std::size_t n) {
    count_ += n;
    if (fd_ < 0) return;
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      if (used_ == sizeof buf_) flush();
      const std::size_t take = std::min(n, sizeof buf_ - used_);
      std::memcpy(buf_ + used_, c, take);
      used_ += take, c += take, n -= take;
    }
  }
  void str(std::string_view s) {
    put<std::uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  /// Writes out what is buffered; false (errno set) once a write failed.
  bool flush() {
    hash_.add(buf_, used_);
    for (std::size_t at = 0; at < used_ && ok_;) {
      const ssize_t n = ::write(fd_, buf_ + at, used_ - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = EIO;
        ok_ = false;
        break;
      }
      at += static_cast<std::size_t>(n);
    }
    used_ = 0;
    return ok_;
  }
  std::uint64_t count() const { return count_; }
  /// The hash of every byte flushed so far.
  std::uint64_t hash() const { return hash_.value(); }

 private:
  int fd_;
  StreamHash hash_;
  bool ok_ = true;
  std::uint64_t count_ = 0;
  std::size_t used_ = 0;
  char buf_[16384];
};

/// Image `c`'s record (after its length), with `bounds` (its debug file's,
/// taken once for both passes); false, with nothing written yet
/// to a counting Writer, when it cannot be written faithfully (a function's
/// name that is not its symbol's, a string pool over 4 GiB).
struct DebugBoundsCopy {
  bool have = false, ok = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> funcs;
};

/// The identity of the debug file libuprobe would read for a file of
/// build-id `build_id` (detail::debug_file_path()) now; all zeros when the
/// build-id is "" or no regular file is there.
FileIdentity debug_file_identity(const std::string& build_id) {
  struct stat st;
  if (build_id.empty() || ::stat(detail::debug_file_path(build_id).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return {};
  return FileIdentity::of(st);
}

void put_identity(Writer& w, const FileIdentity& id) {
  for (long v : {static_cast<long>(id.dev), static_cast<long>(id.ino), static_cast<long>(id.size), id.mtime_sec,
                 id.mtime_nsec, id.ctime_sec, id.ctime_nsec})
    w.put<std::int64_t>(v);
}

bool write_image(const CachedImage& c, const DebugBoundsCopy& bounds, Writer& w) {
  const ElfImage& img = *c.image;
  for (const FuncSym& f : img.funcs)
    if (!(f.symbol_index < img.symbols.size() ? f.name == img.symbols[f.symbol_index].name
                                              : f.symbol_index == ~0u && f.name.empty()))
      return false;
  // The pool: every name, then each distinct version once (NUL-terminated,
  // as in a string table).
  std::uint64_t names = 0;
  for (const ElfSymbol& s : img.symbols) names += s.name.size() + 1;
  std::map<std::string_view, std::uint64_t> version_at;
  std::vector<std::string_view> versions;
  std::uint64_t pool = names;
  for (const ElfSymbol& s : img.symbols)
    if (version_at.try_emplace(s.version, pool).second) versions.push_back(s.version), pool += s.version.size() + 1;
  if (pool > 0xffffffffu) return false;

  put_identity(w, c.id);
  w.str(c.path);
  w.str(img.build_id);
  put_identity(w, debug_file_identity(img.build_id));
  w.put<std::uint32_t>(c.depths);
  w.put<std::uint32_t>(img.type);
  w.put<std::uint32_t>((img.has_symtab ? kHasSymtab : 0) | (img.has_dynsym ? kHasDynsym : 0) |
                       (img.debug_deferred ? kDebugDeferred : 0) | (img.has_stapsdt_section ? kHasStapsdtSection : 0) |
                       (img.stapsdt_base ? kHasStapsdtBase : 0));
  w.put<std::uint64_t>(img.stapsdt_base.value_or(0));
  w.put<std::uint64_t>(img.fde_count);
  w.put<std::uint64_t>(img.malformed_notes);
  for (const std::string* s : {&img.debug_file, &img.deferred_debug_file, &img.deferred_build_id, &img.soname}) w.str(*s);
  for (const auto* list : {&img.rpath, &img.runpath}) {
    w.put<std::uint64_t>(list->size());
    for (const std::string& s : *list) w.str(s);
  }
  w.put<std::uint64_t>(img.loads.size());
  for (const detail::LoadSegment& l : img.loads) {
    for (std::uint64_t v : {l.offset, l.vaddr, l.filesz, l.memsz}) w.put(v);
    w.put(l.flags);
  }
  w.put<std::uint64_t>(pool);
  for (const ElfSymbol& s : img.symbols) w.bytes(s.name.data(), s.name.size()), w.put('\0');
  for (std::string_view v : versions) w.bytes(v.data(), v.size()), w.put('\0');
  w.put<std::uint64_t>(img.symbols.size());
  std::uint64_t name_at = 0;
  for (const ElfSymbol& s : img.symbols) {
    SymbolRecord r{};
    r.name_off = static_cast<std::uint32_t>(name_at);
    r.name_len = static_cast<std::uint32_t>(s.name.size());
    name_at += s.name.size() + 1;
    r.version_off = static_cast<std::uint32_t>(version_at[s.version]);
    r.version_len = static_cast<std::uint32_t>(s.version.size());
    r.address = s.address, r.size = s.size, r.offset = s.offset;
    r.type = s.type, r.binding = s.binding;
    r.flags = static_cast<std::uint8_t>((s.hidden_version ? kHiddenVersion : 0) | (s.in_file ? kInFile : 0) |
                                        (s.executable ? kExecutable : 0) | (s.dynamic ? kDynamic : 0));
    w.put(r);
  }
  w.put<std::uint64_t>(img.funcs.size());
  for (const FuncSym& f : img.funcs) w.put(FuncRecord{f.file_offset, f.size, f.symbol_index, static_cast<std::uint8_t>(f.source), {}});
  w.put<std::uint64_t>(img.lsda_ranges.size());
  for (const auto& [b, e] : img.lsda_ranges) w.put(b), w.put(e);
  w.put<std::uint64_t>(img.notes.size());
  for (const detail::StapsdtNote& n : img.notes) {
    for (std::uint64_t v : {n.pc, n.base, n.semaphore}) w.put(v);
    for (const std::string* s : {&n.provider, &n.name, &n.args}) w.str(*s);
  }
  w.put<std::uint8_t>(bounds.have);
  w.put<std::uint8_t>(bounds.ok);
  w.put<std::uint64_t>(bounds.funcs.size());
  for (const auto& [b, e] : bounds.funcs) w.put(b), w.put(e);
  return true;
}

// ------------------------------------------------------------------ reading

/// The body of a kept file, read in order through a 16 KB buffer, every read
/// bounds-checked (a failed read -- past the end, an I/O error -- sets `ok`
/// false for good), every byte into the file's hash as it is read (one pass:
/// the records taken from it are adopted only once the hash matched,
/// import_elf_tables()).
class Reader {
 public:
  Reader(int fd, std::uint64_t size) : fd_(fd), size_(size) {}
  bool ok() const { return ok_; }
  std::uint64_t left() const { return ok_ ? size_ - pos_ : 0; }
  std::uint64_t pos() const { return pos_; }
  bool bytes(void* dst, std::uint64_t n) {
    if (!ok_ || n > size_ - pos_) return ok_ = false;
    auto* d = static_cast<char*>(dst);
    while (n > 0) {
      if (have_ == used_) {
        if (n >= sizeof buf_) {  // (large: straight into the destination)
          const ssize_t got = ::pread(fd_, d, n, static_cast<off_t>(pos_));
          if (got <= 0) return ok_ = false;
          hash_.add(d, static_cast<std::size_t>(got));
          d += got, n -= static_cast<std::uint64_t>(got), pos_ += static_cast<std::uint64_t>(got);
          continue;
        }
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof buf_, size_ - pos_));
        const ssize_t got = ::pread(fd_, buf_, want, static_cast<off_t>(pos_));
        if (got <= 0) return ok_ = false;
        used_ = 0, have_ = static_cast<std::size_t>(got);
        hash_.add(buf_, have_);
      }
      const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(n, have_ - used_));
      std::memcpy(d, buf_ + used_, take);
      d += take, n -= take, used_ += take, pos_ += take;
    }
    return true;
  }
  template <class T>
  T get() {
    T v{};
    bytes(&v, sizeof v);
    return v;
  }
  /// A count of items of `item_size` bytes each that can all be there.
  std::uint64_t count(std::uint64_t item_size) {
    const std::uint64_t n = get<std::uint64_t>();
    if (ok_ && n > left() / item_size) ok_ = false;
    return ok_ ? n : 0;
  }
  std::string str() {
    std::string s(static_cast<std::size_t>(count(1)), '\0');
    bytes(s.data(), s.size());
    return s;
  }
  /// Past `n` bytes (an image not adopted: read all the same, for the hash).
  void skip(std::uint64_t n) {
    char sink[4096];
    while (ok_ && n > 0) {
      const std::uint64_t take = std::min<std::uint64_t>(n, sizeof sink);
      bytes(sink, take);
      n -= take;
    }
  }
  /// The hash of every byte read so far (of the whole body, once left() is 0).
  std::uint64_t hash() const { return hash_.value(); }

 private:
  int fd_;
  std::uint64_t size_, pos_ = 0;
  bool ok_ = true;
  char buf_[16384];
  std::size_t used_ = 0, have_ = 0;
  StreamHash hash_;  // (of every byte read from the file: bytes past pos_ in buf_ too)
};

/// `n` records of type Rec, read in batches of 256 (one copy out of the
/// reader's buffer each), `each(record)` called for every one in order;
/// false when it refuses one or a read fails.
template <class Rec, class Each>
bool read_records(Reader& r, std::uint64_t n, Each each) {
  static_assert(std::is_trivially_copyable_v<Rec>);
  Rec batch[256];
  for (std::uint64_t done = 0; done < n && r.ok();) {
    const std::uint64_t take = std::min<std::uint64_t>(n - done, 256);
    if (!r.bytes(batch, take * sizeof(Rec))) return false;
    for (std::uint64_t i = 0; i < take; ++i)
      if (!each(batch[i])) return false;
    done += take;
  }
  return r.ok();
}

/// An array of (u64, u64) pairs into `out`, its room populated first.
bool read_pairs(Reader& r, std::vector<std::pair<std::uint64_t, std::uint64_t>>& out) {
  struct Pair {
    std::uint64_t first, second;
  };
  const std::uint64_t n = r.count(sizeof(Pair));
  out.reserve(n);
  populate_pages(out.data(), n * sizeof out[0]);
  return read_records<Pair>(r, n, [&](const Pair& p) {
    out.emplace_back(p.first, p.second);
    return true;
  });
}

struct Adopted {
  FileIdentity id;
  std::string path;
  std::string build_id;
  unsigned depths = 0;
  std::shared_ptr<ElfImage> image;
  bool have_bounds = false, bounds_ok = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> bounds;
};

FileIdentity get_identity(Reader& r) {
  std::int64_t v[7];
  for (std::int64_t& x : v) x = r.get<std::int64_t>();
  return FileIdentity{static_cast<dev_t>(v[0]), static_cast<ino_t>(v[1]), static_cast<off_t>(v[2]), v[3], v[4], v[5], v[6]};
}

/// One image record (its identity read already); false when malformed.
bool read_image_record(Reader& r, Adopted& a) {
  auto img = std::make_shared<ElfImage>();
  img->build_id = a.build_id;
  a.depths = r.get<std::uint32_t>();
  img->type = static_cast<std::uint16_t>(r.get<std::uint32_t>());
  const auto flags = r.get<std::uint32_t>();
  img->has_symtab = flags & kHasSymtab;
  img->has_dynsym = flags & kHasDynsym;
  img->debug_deferred = flags & kDebugDeferred;
  img->has_stapsdt_section = flags & kHasStapsdtSection;
  const auto base = r.get<std::uint64_t>();
  if (flags & kHasStapsdtBase) img->stapsdt_base = base;
  img->fde_count = r.get<std::uint64_t>();
  img->malformed_notes = r.get<std::uint64_t>();
  for (std::string* s : {&img->debug_file, &img->deferred_debug_file, &img->deferred_build_id, &img->soname})
    *s = r.str();
  for (auto* list : {&img->rpath, &img->runpath})
    for (std::uint64_t n = r.count(8); n > 0 && r.ok(); --n) list->push_back(r.str());
  for (std::uint64_t n = r.count(36); n > 0 && r.ok(); --n) {
    detail::LoadSegment l;
    l.offset = r.get<std::uint64_t>(), l.vaddr = r.get<std::uint64_t>();
    l.filesz = r.get<std::uint64_t>(), l.memsz = r.get<std::uint64_t>();
    l.flags = r.get<std::uint32_t>();
    img->loads.push_back(l);
  }
  // The pool: names view it, for the image's life.
  const std::uint64_t pool_size = r.count(1);
  auto pool = std::shared_ptr<char[]>(new char[pool_size ? pool_size : 1]);
  populate_pages(pool.get(), pool_size);
  r.bytes(pool.get(), pool_size);
  img->elf_handles.push_back(std::shared_ptr<void>(pool, pool.get()));
  const std::uint64_t nsyms = r.count(sizeof(SymbolRecord));
  img->symbols.reserve(nsyms);
  populate_pages(img->symbols.data(), nsyms * sizeof(ElfSymbol));
  const bool symbols_read = read_records<SymbolRecord>(r, nsyms, [&](const SymbolRecord& s) {
    if (std::uint64_t{s.name_off} + s.name_len >= pool_size || pool[s.name_off + s.name_len] != '\0' ||
        std::uint64_t{s.version_off} + s.version_len >= pool_size || pool[s.version_off + s.version_len] != '\0')
      return false;
    ElfSymbol e;
    e.name = std::string_view(pool.get() + s.name_off, s.name_len);
    e.version = std::string_view(pool.get() + s.version_off, s.version_len);
    e.address = s.address, e.size = s.size, e.offset = s.offset;
    e.type = s.type, e.binding = s.binding;
    e.hidden_version = s.flags & kHiddenVersion, e.in_file = s.flags & kInFile;
    e.executable = s.flags & kExecutable, e.dynamic = s.flags & kDynamic;
    img->symbols.push_back(e);
    return true;
  });
  if (!symbols_read) return false;
  const std::uint64_t nfuncs = r.count(sizeof(FuncRecord));
  img->funcs.reserve(nfuncs);
  img->reach.reserve(nfuncs);
  populate_pages(img->funcs.data(), nfuncs * sizeof(FuncSym));
  populate_pages(img->reach.data(), nfuncs * sizeof(std::uint64_t));
  std::uint64_t reach = 0;
  const bool funcs_read = read_records<FuncRecord>(r, nfuncs, [&](const FuncRecord& f) {
    if (f.source > static_cast<std::uint8_t>(detail::BoundsSource::eh_frame)) return false;
    FuncSym s{{}, f.file_offset, f.size, static_cast<detail::BoundsSource>(f.source), f.symbol_index};
    if (f.symbol_index != ~0u) {
      if (f.symbol_index >= img->symbols.size()) return false;
      s.name = img->symbols[f.symbol_index].name;
    }
    // Sorted by (file_offset, size), as enclosing_function()'s searches need.
    if (!img->funcs.empty()) {
      const FuncSym& p = img->funcs.back();
      if (std::tie(p.file_offset, p.size) > std::tie(s.file_offset, s.size)) return false;
    }
    const std::uint64_t end = s.file_offset + s.size < s.file_offset ? ~std::uint64_t{0} : s.file_offset + s.size;
    reach = std::max(reach, end);
    img->funcs.push_back(s);
    img->reach.push_back(reach);
    return true;
  });
  if (!funcs_read) return false;
  if (!read_pairs(r, img->lsda_ranges) || !std::is_sorted(img->lsda_ranges.begin(), img->lsda_ranges.end()))
    return false;
  for (std::uint64_t n = r.count(48); n > 0 && r.ok(); --n) {
    detail::StapsdtNote note;
    note.pc = r.get<std::uint64_t>(), note.base = r.get<std::uint64_t>(), note.semaphore = r.get<std::uint64_t>();
    note.provider = r.str(), note.name = r.str(), note.args = r.str();
    img->notes.push_back(std::move(note));
  }
  a.have_bounds = r.get<std::uint8_t>() != 0;
  a.bounds_ok = r.get<std::uint8_t>() != 0;
  read_pairs(r, a.bounds);
  a.image = std::move(img);
  return r.ok() && a.depths != 0 && a.depths < 4;
}

}  // namespace

namespace {

/// Whether a file of identity `id` has not changed for long enough that a
/// change after it was read cannot keep its identity: its modification and
/// status-change times at least kSettledSeconds before `now` (a filesystem
/// with coarse timestamps -- 1 s on ext4 with small inodes, 2 s on vfat --
/// gives a file rewritten within one tick the identity it had).
constexpr long kSettledSeconds = 3;
bool settled(const FileIdentity& id, long now) {
  return id.mtime_sec + kSettledSeconds <= now && id.ctime_sec + kSettledSeconds <= now;
}

/// The debug-file bounds `funcs` of `img` that can change an answer of
/// debug_file_refines() (debug_file.cpp), in their order: it is asked about
/// a function of the image's own tables (function_at(), elf_info.cpp), and
/// answers true for a bound holding the offset that is shorter than that
/// function, or as long and elsewhere. A bound whose every function of the
/// image overlapping it is exactly itself, or shorter (for libc, the debug
/// twin of every exported function, and the local functions no exported
/// one holds), can never do so, and is left out: for Debian 12's libc,
/// nearly all of its ~60,000 bounds, ~1 MB of the file and most of its
/// import.
std::vector<std::pair<std::uint64_t, std::uint64_t>> bounds_that_refine(
    const ElfImage& img, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& funcs) {
  struct Span {
    std::uint64_t start, end, size;
  };
  std::vector<Span> own;  // (the functions debug_file_refines() is asked about, by start)
  for (const FuncSym& f : img.funcs)
    if (f.size > 0) own.push_back({f.file_offset, f.file_offset + f.size, f.size});
  std::sort(own.begin(), own.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  std::vector<std::uint64_t> reach(own.size());  // the furthest end of own[0..i]
  for (std::size_t i = 0; i < own.size(); ++i) reach[i] = std::max(own[i].end, i ? reach[i - 1] : 0);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (const auto& [start, size] : funcs) {
    if (size == 0) continue;  // (holds no offset)
    const std::uint64_t end = start + size;
    // Every own function starting before this bound's end, back while one
    // of them still reaches past its start.
    std::size_t i = static_cast<std::size_t>(
        std::lower_bound(own.begin(), own.end(), end, [](const Span& a, std::uint64_t v) { return a.start < v; }) -
        own.begin());
    bool refines = false;
    while (i-- > 0 && reach[i] > start && !refines)
      refines = own[i].end > start && (size < own[i].size || (size == own[i].size && start != own[i].start));
    if (refines) out.emplace_back(start, size);
  }
  return out;
}

}  // namespace

std::size_t export_elf_tables(const std::string& path, bool settled_only) {
  return export_elf_tables(path, settled_only, {});
}

std::size_t export_elf_tables(const std::string& path, bool settled_only, const std::vector<std::string>& files) {
  const long now = static_cast<long>(::time(nullptr));
  std::vector<CachedImage> images = detail::cached_images();
  if (!files.empty()) {
    std::vector<std::pair<dev_t, ino_t>> wanted;
    for (const std::string& f : files)
      if (struct stat st; ::stat(f.c_str(), &st) == 0) wanted.emplace_back(st.st_dev, st.st_ino);
    images.erase(std::remove_if(images.begin(), images.end(),
                                [&](const CachedImage& c) {
                                  return std::find(wanted.begin(), wanted.end(),
                                                   std::pair<dev_t, ino_t>(c.id.dev, c.id.ino)) == wanted.end();
                                }),
                 images.end());
  }
  if (settled_only)
    images.erase(std::remove_if(images.begin(), images.end(),
                                [&](const CachedImage& c) {
                                  const FileIdentity d = debug_file_identity(c.image->build_id);
                                  return !settled(c.id, now) || (d.ino != 0 && !settled(d, now));
                                }),
                 images.end());
  std::vector<DebugBoundsCopy> bounds(images.size());
  struct Record {
    std::size_t image;
    std::uint64_t length;
  };
  std::vector<Record> records;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const ElfImage& img = *images[i].image;
    detail::read_debug_bounds_of(img);  // (what the importer's checks of a site read: here, not there)
    bounds[i].have = img.debug_deferred && detail::cached_debug_bounds(img, bounds[i].ok, bounds[i].funcs);
    if (bounds[i].have) bounds[i].funcs = bounds_that_refine(img, bounds[i].funcs);
    Writer counter(-1);
    if (write_image(images[i], bounds[i], counter)) records.push_back({i, counter.count()});
  }
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    throw Error(Errc::system, tmp, 0, std::string("cannot create the ELF tables file: ") + std::strerror(err), err);
  }
  Writer w(fd);
  w.bytes(kMagic, sizeof kMagic);
  w.put(kVersion);
  w.put<std::uint32_t>(0);
  w.put<std::uint64_t>(records.size());
  for (const Record& r : records) {
    w.put<std::uint64_t>(r.length);
    write_image(images[r.image], bounds[r.image], w);
  }
  w.bytes(kEnd, sizeof kEnd);
  w.flush();
  w.put<std::uint64_t>(w.hash());
  const bool written = w.flush();
  const int err = written ? 0 : errno;
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = err ? err : errno;
    ::unlink(tmp.c_str());
    throw Error(Errc::system, path, 0, std::string("cannot write the ELF tables file: ") + std::strerror(e), e);
  }
  return records.size();
}

std::size_t elf_tables_held() noexcept {
  try {
    return detail::cached_images().size();
  } catch (...) {
    return 0;
  }
}

std::size_t import_elf_tables(const std::string& path) noexcept {
  try {
    // (Not blocking: a FIFO in its place would wait for a writer forever.)
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8) {
      ::close(fd);
      return 0;
    }
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    // One pass: the records are read while every byte goes into the hash,
    // and a file whose hash does not match (damaged) gives nothing: what
    // was read from it is dropped before anything is adopted.
    const std::uint64_t body = static_cast<std::uint64_t>(st.st_size) - 8;
    Reader r(fd, body);
    char magic[8];
    r.bytes(magic, sizeof magic);
    const auto version = r.get<std::uint32_t>();
    r.get<std::uint32_t>();
    if (!r.ok() || std::memcmp(magic, kMagic, sizeof magic) != 0 || version != kVersion) return 0;
    std::vector<Adopted> adopted;
    for (std::uint64_t n = r.count(8); n > 0 && r.ok(); --n) {
      const std::uint64_t len = r.count(1), start = r.pos();
      Adopted a;
      a.id = get_identity(r);
      a.path = r.str();
      a.build_id = r.str();
      const FileIdentity debug_id = get_identity(r);
      // Only a file unchanged since it was read, beside the same debug file
      // (or still none): their identities now.
      struct stat now;
      const bool same = r.ok() && r.pos() - start <= len && ::stat(a.path.c_str(), &now) == 0 &&
                        S_ISREG(now.st_mode) && FileIdentity::of(now) == a.id &&
                        debug_file_identity(a.build_id) == debug_id;
      if (!same) {
        r.skip(len - std::min(len, r.pos() - start));
        continue;
      }
      if (!read_image_record(r, a) || r.pos() - start != len) return 0;
      adopted.push_back(std::move(a));
    }
    char end[8];
    if (!r.bytes(end, sizeof end) || std::memcmp(end, kEnd, sizeof end) != 0 || r.left() != 0) return 0;
    std::uint64_t want = 0;
    if (::pread(fd, &want, sizeof want, static_cast<off_t>(body)) != static_cast<ssize_t>(sizeof want) ||
        want != r.hash())
      return 0;
    std::size_t count = 0;
    for (Adopted& a : adopted) {
      const ElfImage& img = *a.image;
      if (!detail::adopt_image(a.id, a.path, a.depths, a.image)) continue;
      ++count;
      // The debug file's bounds as read there, while that file is still
      // there (else debug_file_refines() reads, and says what it can).
      if (a.have_bounds && img.debug_deferred && (!a.bounds_ok || ::access(img.deferred_debug_file.c_str(), R_OK) == 0))
        detail::adopt_debug_bounds(img, a.bounds_ok, std::move(a.bounds));
    }
    return count;
  } catch (...) {
    return 0;
  }
}

}  // namespace uprobe
