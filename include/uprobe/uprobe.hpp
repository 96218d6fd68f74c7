// SPDX-License-Identifier: MIT
#pragma once
/// @file uprobe.hpp
/// libuprobe public C++ API: the kernel's uprobes (include/linux/uprobes.h),
/// in process. Register a Consumer on a probe site given as (file, offset) or
/// as an address; every execution of that instruction by any thread runs the
/// consumer's handler with the full register context, then the original
/// instruction runs (emulated, or relocated out of line).

#include <sys/types.h>

#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "uprobe/regs.hpp"

namespace uprobe {

/// What an entry handler asks for after a hit. Mirrors the kernel's return
/// values of uprobe_consumer::handler (UPROBE_HANDLER_REMOVE,
/// UPROBE_HANDLER_IGNORE).
enum class Action : int {
  keep = 0,    ///< stay attached
  remove = 1,  ///< UPROBE_HANDLER_REMOVE: see Consumer::handler
  ignore = 2,  ///< UPROBE_HANDLER_IGNORE: no return call for this invocation (return consumers)
};

/// Which callbacks a consumer has: the kernel's non-NULL `handler` and
/// `ret_handler`. A consumer with both is a session consumer: its entry
/// handler and its ret_handler of the same invocation share a 64-bit cookie
/// (session_cookie()), and an entry returning Action::ignore gets no return
/// call for that invocation.
enum class Callbacks : unsigned {
  entry = 1,          ///< handler() only (the default)
  ret = 2,            ///< ret_handler() only
  entry_and_ret = 3,  ///< both: a session consumer
};

/// Defined when the return-probe API (ret_handler, sessions) is available.
#define UPROBE_HAS_URETPROBE 1

/// A probe consumer: the kernel's `struct uprobe_consumer`.
///
/// One Consumer object may be registered on many probes, but at most once on
/// the same probe. It must outlive its registrations (unregister_uprobe()
/// returns only when no thread is still inside its callbacks).
class Consumer {
 public:
  /// A consumer with the given callbacks (see Callbacks). Which callbacks a
  /// consumer has is fixed at construction, as the kernel reads it from the
  /// function pointers at register time.
  explicit Consumer(Callbacks callbacks = Callbacks::entry) noexcept : callbacks_(callbacks) {}
  virtual ~Consumer() = default;

  /// Called on the hitting thread, before the probed instruction runs, with
  /// that thread's registers (readable and writable, see Regs). Only called
  /// when the consumer was built with Callbacks::entry or entry_and_ret.
  ///
  /// Runs in signal context (int3 path): it must be async-signal-safe unless
  /// the program knows the probed code is never reached from a state where
  /// that matters (no malloc, no locks the probed thread may hold, no stdio
  /// is the safe rule). A probe hit inside a handler is not reported again
  /// (the per-thread recursion guard counts it in Stats::recursion_misses).
  ///
  /// Return Action::remove to say this consumer wants no more hits at this
  /// probe: it is not called there again until unregistered and registered
  /// anew, and when every consumer of the probe has said remove, the probe
  /// site is taken out of the process's text (the kernel's unapply_uprobe();
  /// the registration itself stays until unregister_uprobe()). A consumer with
  /// a ret_handler may return Action::ignore: no return call for this
  /// invocation.
  virtual Action handler(Regs& regs) {
    (void)regs;
    return Action::keep;
  }

  /// Called when an invocation of the probed function returns (a uretprobe;
  /// the probe must be at the function's entry, where the return address is at
  /// *rsp). `regs` holds the registers as the function left them: rax/rdx
  /// are the return value (see return_xmm() for xmm0/xmm1), rip is the
  /// address the function returns to, rsp the stack pointer after the return.
  /// Writes to the GPRs and rflags take effect; writing rip makes the return go
  /// there. `func` is the probed address (the kernel's `func` argument).
  /// At most 10 consumers with a ret_handler per probe (register_uprobe
  /// refuses the 11th with Errc::conflict).
  /// Only called when the consumer was built with Callbacks::ret or
  /// entry_and_ret, and only for invocations whose entry this consumer saw
  /// (registered, passed its filter, did not return remove or ignore).
  /// Runs in the return trampoline on the returning thread, with the same
  /// rules as handler() (async-signal-safe; recursion guard).
  virtual void ret_handler(Regs& regs, std::uint64_t func) {
    (void)regs;
    (void)func;
  }

  /// Per-thread filter: return false and this consumer is not called for hits
  /// by thread `tid` (the kernel's uprobe_consumer::filter, which is
  /// per-process there; in process the natural unit is the thread). Called on
  /// every entry hit before handler(), in the same signal context. Default: all.
  virtual bool filter(pid_t tid) {
    (void)tid;
    return true;
  }

  /// The callbacks this consumer has.
  Callbacks callbacks() const noexcept { return callbacks_; }

  /// True when the consumer declared that its callbacks never touch vector or
  /// x87 state (see set_vector_state_unused()).
  bool vector_state_unused() const noexcept { return vector_state_unused_; }

 protected:
  /// Declares that handler(), ret_handler() and filter() use no floating
  /// point, SSE/AVX or x87 state (and call nothing that does, such as libc's
  /// string functions: compile them with -mgeneral-regs-only). Optimized
  /// probes and the return trampoline then save no vector or x87 state around
  /// the callbacks. A consumer that declares nothing is always correct: what
  /// the site makes live is preserved around it (Config::site_state: at a
  /// function entry xmm/ymm/zmm0-15, the MXCSR and the x87 control word,
  /// at a return the same plus the x87 return values, elsewhere everything;
  /// 8-21 ns per hit on AMD Zen 4, where an xsavec/xrstor of the whole state
  /// cost 150-200 ns; only xmm0..xmmN and the MXCSR when the code of its
  /// handler() and ret_handler() reads as legacy SSE at registration:
  /// ProbeInfo::entry_state), and its callbacks start with the default floating-point
  /// controls (MXCSR control bits 0x1f80, x87 control word 0x37f), as in a
  /// signal handler. Call it in the constructor, before registering. Ignored (the
  /// state is always saved) when libuprobe is built with ThreadSanitizer,
  /// whose runtime, called on every memory access of the instrumented code,
  /// uses SSE registers.
  void set_vector_state_unused(bool unused = true) noexcept { vector_state_unused_ = unused; }

 private:
  Callbacks callbacks_;
  bool vector_state_unused_ = false;
};

/// The cookie of the current session invocation: valid inside handler() and
/// ret_handler() of a session consumer (Callbacks::entry_and_ret), where the
/// value written at entry is the value read at return of the same invocation
/// (the kernel's `__u64 *data`; bpf_session_cookie()). Starts at 0 for every
/// invocation. Outside those callbacks it returns a per-thread scratch value.
/// Async-signal-safe.
std::uint64_t& session_cookie() noexcept;

/// xmm0 (i = 0) or xmm1 (i = 1) as the returning function left it: the
/// floating-point return value. Valid inside ret_handler(); writes take effect.
/// Each register is 16 bytes (low 8: a double return value). Async-signal-safe.
std::uint8_t* return_xmm(unsigned i) noexcept;

/// Error kinds of the registration API.
enum class Errc {
  file_not_found,      ///< the path does not exist or cannot be opened/statted
  bad_offset,          ///< offset past the end of the file
  not_executable,      ///< offset outside every executable PT_LOAD segment
  mid_instruction,     ///< offset falls inside an instruction of a known function
  refused_instruction, ///< an existing int3, undecodable bytes, or an instruction we cannot run out of line
  not_file_backed,     ///< an address in anonymous memory, or in no mapping at all
  forbidden_target,    ///< libuprobe's own code or its hot-path dependencies; or any target in a process
                       ///< where libuprobe was loaded after libc (its interposers would not see the program)
  conflict,            ///< this consumer is already registered on this probe, or is not registered on it; an
                       ///< ambiguous symbol or library name (uprobe/symbols.hpp, uprobe/usdt.hpp)
  in_handler,          ///< (un)registering from inside a handler, or from a pthread_atfork handler inside its fork(), would deadlock
  system,              ///< a system call failed (message says which and errno)
  invalid_argument,    ///< a batch request without a consumer (uprobe/batch.hpp)
  ref_ctr_conflict,    ///< the probe is registered with another USDT semaphore (ref_ctr_offset; 0 = none): every
                       ///< consumer of a probe names the same one (the kernel refuses it with -EINVAL)
  too_many_return_consumers,  ///< the probe has 10 consumers with a ret_handler already (all one return
                              ///< instance records)
};

/// The typed error thrown by the registration API. what() names the path, the
/// file offset and the reason; path() and offset() give them separately.
/// A request that throws has changed nothing in the process.
class Error : public std::runtime_error {
 public:
  /// `sys_errno`: the errno of the failed system call behind the refusal
  /// (open(2) or stat(2) of the path for file_not_found), 0 if none.
  Error(Errc code, std::string path, std::uint64_t offset, const std::string& why, int sys_errno = 0);
  Errc code() const noexcept { return code_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t offset() const noexcept { return offset_; }
  /// The errno of the failed system call (e.g. EACCES for an unreadable file,
  /// ENOENT for a missing one, ENOTDIR), or 0 when the refusal is not one.
  int sys_errno() const noexcept { return sys_errno_; }

 private:
  Errc code_;
  std::string path_;
  std::uint64_t offset_;
  int sys_errno_;
};

/// An opaque registered probe: the kernel's `struct uprobe`, keyed by
/// (st_dev, st_ino, offset). Valid while at least one consumer is registered.
class Uprobe;

/// Registers `consumer` on the instruction at file offset `offset` of the
/// file `path` (the kernel's uprobe_register(inode, offset, 0, uc)). The probe
/// applies to every executable mapping of that file in this process, keyed by
/// (st_dev, st_ino, offset), so hard links and several mappings share it.
/// Many consumers may share one probe site.
///
/// Thread-safety: may be called from any thread, concurrently with hits and
/// with other (un)registrations; not from inside a handler (Errc::in_handler).
/// Not async-signal-safe (allocates, takes the registry lock).
/// @throws Error with a clear message on any refusal; nothing changed then.
Uprobe* register_uprobe(const std::string& path, std::uint64_t offset, Consumer& consumer);

/// Same, with a USDT semaphore (the kernel's uprobe_register(inode, offset,
/// ref_ctr_offset, uc)): `ref_ctr_offset` is the file offset of the 16-bit
/// reference count the probe's is-enabled check reads (usdt::Probe's
/// semaphore_offset). While this consumer is registered, the count is
/// incremented by one in every mapping of the file that holds it (also in
/// mappings that appear later through dlopen), and decremented again on
/// unregister, never below 0. 0 means no semaphore. All consumers of one
/// probe must name the same ref_ctr_offset (else Errc::ref_ctr_conflict,
/// and nothing changes: no count moves).
Uprobe* register_uprobe(const std::string& path, std::uint64_t offset, std::uint64_t ref_ctr_offset,
                        Consumer& consumer);

/// Same, with the probe site given as an address in this process: the mapping
/// that holds `address` gives (file, offset) as in resolve_address().
Uprobe* register_uprobe(const void* address, Consumer& consumer);

/// Unregisters `consumer` from `probe` (the kernel's uprobe_unregister()).
/// Returns when no thread can still be running a callback of this consumer
/// for this probe (an RCU grace period). When the last consumer goes, the
/// original bytes are restored exactly in every mapping and `probe` becomes
/// invalid.
/// Thread-safety and errors as register_uprobe().
void unregister_uprobe(Uprobe* probe, Consumer& consumer);

/// The return trampoline: what the saved return address of a function with a
/// pending return probe reads while the function runs, but for a function
/// entered through an optimized entry probe, which returns to a landing of
/// its own (see is_return_trampoline()). Async-signal-safe.
const void* return_trampoline() noexcept;

/// Whether `address` is one of libuprobe's return addresses: the return
/// trampoline or the landing of an optimized entry (what the saved return
/// address of a function with a pending return probe reads while the function
/// runs). Async-signal-safe.
bool is_return_trampoline(const void* address) noexcept;

/// For stack walkers: replaces, in `frames` (n return addresses of the calling
/// thread's stack, innermost first, as backtrace(3) gives them), every
/// return address of libuprobe's (is_return_trampoline()) by the real one, matching
/// them to the thread's pending return instances innermost first. Returns how
/// many were replaced. backtrace(3), _Unwind_Backtrace and C++ exceptions are
/// handled by libuprobe itself; this is for home-made frame-pointer walkers.
/// Async-signal-safe.
int fixup_backtrace(void** frames, int n) noexcept;

/// Return instances pending on the calling thread (its return stack depth).
/// Async-signal-safe.
unsigned return_stack_depth() noexcept;

/// Reads of memory that may not be readable (a pointer argument of a
/// probed function), as BPF programs make them with bpf_probe_read_user()
/// and bpf_probe_read_user_str(): never a fault in the program, an error
/// instead.
///
/// By default they are made with process_vm_readv(2) on this process (a
/// system call each). enable_fault_safe_reads() makes them plain loads in
/// the process, as the kernel's copy_from_user() with its exception table:
/// libuprobe then owns the first look at SIGSEGV and SIGBUS (the kernel's
/// action for both is libuprobe's handler, with the program's flags and
/// sa_mask; sigaction() still sets and shows the program's own
/// disposition). A fault of one of these reads resumes the read, which
/// fails; any other signal reaches the program's handler exactly as before,
/// or its default action (the process dies of it, as without libuprobe).
/// An address in the first page (NULL, a small integer: Linux maps nothing
/// there unless a privileged program asks, vm.mmap_min_addr) or at or above
/// 2^56 (a kernel address, most non-canonical ones) is answered as
/// unreadable without a read.
/// A thread whose mask blocks SIGSEGV or SIGBUS (where the kernel kills the
/// process at a fault instead) reads with process_vm_readv(2): libuprobe
/// follows the mask through libc (sigprocmask and its family, handlers,
/// setcontext, longjmp; one rt_sigprocmask(2) after a change) but not
/// through raw system calls (README.md, "Reads of memory that may not be
/// readable").
///
/// Arms the in-process reads: idempotent; returns true once armed, false
/// when it cannot (rt_sigaction(2) failed, or in a vfork() child). Call it
/// before the reads, not from a handler (it takes sigaction()'s locks).
/// Thread-safe; not async-signal-safe.
bool enable_fault_safe_reads() noexcept;

/// bpf_probe_read_user(): copies `size` bytes at `src` (an address in this
/// process) to `dst`. Returns 0, or -EFAULT when one of them cannot be read
/// (unmapped, PROT_NONE, past the end of a mapped file): `dst` is then
/// zeroed (all `size` bytes). `dst` must be the caller's writable memory (a
/// bad `dst` faults as any store does). The kernel's
/// copy_from_user_nofault() (mm/maccess.c). Any thread; async-signal-safe;
/// no allocation, no lock.
long probe_read_user(void* dst, std::uint32_t size, const void* src) noexcept;

/// bpf_probe_read_user_str(): copies the NUL-terminated string at `src` to
/// `dst`, at most `size` bytes NUL included. Returns the bytes written, NUL
/// included (a string of `size` - 1 bytes or more is cut to `size` - 1 and
/// its NUL: `size`); -EFAULT when a byte of it cannot be read, up to its NUL
/// or up to the `size`th byte, whichever comes first (a string running into
/// an unreadable page reads as an error, as the kernel's
/// strncpy_from_user()): `dst` is then zeroed (all `size` bytes). The bytes
/// of `dst` after the NUL are unspecified. `size` 0: returns 0. The
/// kernel's strncpy_from_user_nofault() (mm/maccess.c), `dst` as above.
/// Any thread; async-signal-safe; no allocation, no lock.
long probe_read_user_str(void* dst, std::uint32_t size, const void* src) noexcept;

/// A (file, offset) pair as the kernel keys probes.
struct FileOffset {
  std::string path;      ///< path of the mapped file as /proc/self/maps names it
  std::uint64_t offset;  ///< byte offset in the file
  dev_t dev;             ///< st_dev of the file
  ino_t ino;             ///< st_ino of the file
};

/// Resolves an address of this process to the file and file offset mapped
/// there (offset = pgoff + address - vma start).
/// @throws Error(Errc::not_file_backed) for anonymous memory or no mapping.
FileOffset resolve_address(const void* address);

/// RAII registration: registers in the constructor, unregisters in the
/// destructor (or in detach()). Move-only.
class Attachment {
 public:
  Attachment() = default;
  /// register_uprobe(path, offset, consumer). @throws Error as it does.
  Attachment(const std::string& path, std::uint64_t offset, Consumer& consumer);
  /// register_uprobe(path, offset, ref_ctr_offset, consumer): with a USDT
  /// semaphore, counted while attached. @throws Error as it does
  /// (Errc::ref_ctr_conflict for another semaphore than the probe's).
  Attachment(const std::string& path, std::uint64_t offset, std::uint64_t ref_ctr_offset, Consumer& consumer);
  /// register_uprobe(address, consumer). @throws Error as it does.
  Attachment(const void* address, Consumer& consumer);
  Attachment(Attachment&& other) noexcept;
  Attachment& operator=(Attachment&& other) noexcept;
  Attachment(const Attachment&) = delete;
  Attachment& operator=(const Attachment&) = delete;
  ~Attachment();
  /// Unregisters now (idempotent).
  void detach();
  /// The registered probe, or nullptr once detached.
  Uprobe* probe() const noexcept { return probe_; }
  /// The registered consumer, or nullptr once detached.
  Consumer* consumer() const noexcept { return consumer_; }
  /// Takes over an existing registration of `consumer` on `probe` (e.g. one
  /// made by register_uprobes()): this Attachment unregisters it. No check is
  /// made; a null probe gives an empty Attachment.
  static Attachment adopt(Uprobe* probe, Consumer& consumer) noexcept;
  /// Lets go of the registration without unregistering it (the caller now
  /// owns it, e.g. to pass it to unregister_uprobes()); the Attachment is empty.
  void release() noexcept {
    probe_ = nullptr;
    consumer_ = nullptr;
  }

 private:
  Uprobe* probe_ = nullptr;
  Consumer* consumer_ = nullptr;
};

/// How a probe's sites are patched now (ProbeInfo::mode). The kernel has
/// int3 and, for nop5 sites, the optimized jump
/// (arch/x86/kernel/uprobes.c: arch_uprobe_optimize()).
enum class ProbeMode : std::uint8_t {
  pending,          ///< no mapping of the file yet: nothing is written
  int3,             ///< a breakpoint: each hit is a SIGTRAP (ProbeInfo::why_not_optimized says why)
  optimized_nop5,   ///< a 5-byte nop became a jump to the probe's trampoline
  optimized_entry,  ///< a function entry: the jump displaced its first instructions, which run relocated in a
                    ///< window slot (ProbeInfo::displaced bytes)
  optimized_window,  ///< a site inside a function (Config::optimize_windows): the jump displaced the instructions
                     ///< from the site on, which run relocated in a window slot (ProbeInfo::displaced bytes)
  optimized_punned,  ///< an instruction shorter than the jump (E9Patch's tactic B2, "instruction punning"): a jump
                     ///< whose first byte(s) replace the instruction's own and whose other rel32 bytes are the
                     ///< original bytes after it, unchanged; it lands on a hop placed at the address those bytes
                     ///< select, which goes on to the stub. The instruction runs relocated (ProbeInfo::displaced
                     ///< = its length). Nothing a branch can reach changes, so no thread check is needed.
  optimized_padded,  ///< a punned jump padded with 1-3 redundant prefixes before its opcode (E9Patch's tactic T1),
                     ///< taken where the unpadded one's target range has no free page (another mapping there, or
                     ///< outside user space): each prefix moves the jump's rel32 one byte further over the bytes
                     ///< after the instruction, so they select another range. As optimized_punned otherwise: only
                     ///< the instruction's own bytes change (the prefixes, the opcode, the rel32's free bytes).
  optimized_evicted,  ///< a punned jump over an evicted successor (E9Patch's tactic T2, Config::optimize_evicted),
                      ///< taken where no punned or padded form finds a free page: the next instruction first got a
                      ///< jump of its own (B1, or punned/padded over the bytes after it) to a trampoline running its
                      ///< relocated copy, and the site's jump keeps that jump's bytes, which select other targets.
                      ///< A branch to the successor takes its jump; detach restores the site, then the successor.
};

/// The mode's name as the tools print it: "pending", "int3",
/// "optimized-nop5", "optimized-entry", "optimized-window",
/// "optimized-punned", "optimized-punned-padded" ("?" for a value outside
/// the enum).
/// Pure; async-signal-safe.
constexpr const char* to_string(ProbeMode mode) noexcept {
  switch (mode) {
    case ProbeMode::pending: return "pending";
    case ProbeMode::int3: return "int3";
    case ProbeMode::optimized_nop5: return "optimized-nop5";
    case ProbeMode::optimized_entry: return "optimized-entry";
    case ProbeMode::optimized_window: return "optimized-window";
    case ProbeMode::optimized_punned: return "optimized-punned";
    case ProbeMode::optimized_padded: return "optimized-punned-padded";
    case ProbeMode::optimized_evicted: return "optimized-evicted";
  }
  return "?";
}

/// Prints to_string(mode). Not async-signal-safe (iostreams).
inline std::ostream& operator<<(std::ostream& os, ProbeMode mode) { return os << to_string(mode); }

/// Probe-site state, for tests and tools.
struct ProbeInfo {
  FileOffset where;          ///< the probe key
  ProbeMode mode = ProbeMode::pending;  ///< how its sites are patched now
  /// Bytes displaced by an optimized entry's, window's or punned jump (the
  /// relocated instructions; 0 for nop5 and int3 probes).
  unsigned displaced = 0;
  /// Why the probe is not optimized ("" when it is).
  std::string why_not_optimized;
  /// Why its punned jump does not evict its successor (E9Patch's T2,
  /// ProbeMode::optimized_evicted): the plan's reason when none is planned
  /// ("no successor eviction: ..."), else the last placement's ("" when it
  /// evicts, has no punned jump, or did not try: its punned or padded jump
  /// found a page of its own first), "evicting the successor `INSN`: " and
  /// e.g. "every trampoline address its bytes allow is mapped ([0x...,
  /// 0x...), ...)" or "every address its bytes allow for the successor's
  /// trampoline or the site's hop is mapped (...)" (impossible in this
  /// address space, checked against a fresh read of it) or "no free pair of addresses for both jumps found
  /// in 20000 tries (the search gave up)". A probe that stays int3 for it
  /// says the same in why_not_optimized.
  std::string why_not_evicted;
  unsigned sites = 0;        ///< mappings where the breakpoint is written now
  unsigned consumers = 0;    ///< registered consumers
  bool emulated = false;     ///< the instruction is emulated (else run out of line)
  std::string instruction;   ///< disassembly of the probed instruction
  /// Where glibc runs the probed function with every signal blocked by its
  /// own rt_sigprocmask system call, which libuprobe cannot interpose
  /// (e.g. "thread exit", "posix_spawn()'s child before execve"; several
  /// separated by "; "): an int3 hit there is fatal (the kernel forces
  /// SIGTRAP), an optimized site is not. "" when none is known (libc
  /// functions only; README.md, "Signal masks", lists them).
  std::string signals_blocked;
  /// The code symbol holding the probe (uprobe::symbol_at() of the file):
  /// "NAME", or "NAME+0xOFF" inside it; "" when none.
  std::string symbol;
  /// The bounds of the function holding the probe, which an optimized entry
  /// needs (its first instructions are displaced only after the whole
  /// function and its neighbours are checked), and where they come from:
  /// "SOURCE 0xSTART+0xSIZE" (file offset and size in bytes), SOURCE one of
  /// "symtab", "dynsym" (a sized symbol of the file), "debuginfo" (of its
  /// separate debug file, found by build-id under /usr/lib/debug/.build-id/)
  /// or "eh_frame" (an FDE of the file's .eh_frame: stripped files keep
  /// them); "" when none is known.
  std::string bounds;
  /// When the function holding the probe is what GNU indirect functions
  /// (STT_GNU_IFUNC) of its file are bound to in this process (their
  /// resolvers chose it; the dynamic linker's binding, dlsym()'s answer), or
  /// when the probe is in such a resolver: says which, e.g.
  /// "IFUNC strlen@@GLIBC_2.2.5 -> __strlen_evex" (several: "IFUNC
  /// memcpy@@GLIBC_2.14, memmove@@GLIBC_2.2.5 -> ..."; an implementation
  /// without a symbol, as in a libc without .symtab, by its file offset:
  /// "-> offset 0x1a2b30", recognised at its first byte only), or "resolver
  /// of IFUNC strlen (bound to __strlen_evex: a probe here sees no calls)".
  /// "" otherwise (and while the file is not loaded here).
  std::string ifunc;
  /// What an optimized hit preserves of the vector and x87 state around the
  /// consumers that run at the entry side (handlers, filters of their own)
  /// and around the ret_handlers, beyond the general registers (the int3
  /// path has the kernel's signal frame): "none" (each of them declared
  /// set_vector_state_unused(), or none runs there); "xmm0-xmmN, MXCSR" or
  /// "none (code read)" (their code was read at registration and touches no
  /// other vector state: legacy SSE instructions, no call the reading cannot
  /// follow; "none (code read)": integer code, no vector register at all, so
  /// no MXCSR either); else what the site makes
  /// live: "entry" (a function entry: vectors 0-15 at the width in use, the
  /// MXCSR, the x87 control word), "return" (the same and st0/st1) or "full".
  std::string entry_state, return_state;
};

/// How much probe_info() finds out.
enum class ProbeDetail : std::uint8_t {
  /// What the registry knows: every field of ProbeInfo but `symbol`, `bounds`
  /// and `ifunc`, which stay "". Reads no file and asks no dynamic linker: a
  /// lock of the registry, a few strings (for a tool that notes the mode of
  /// thousands of probes it just attached, some of them on the libc functions
  /// a fuller answer would call).
  state,
  /// Every field: also the symbol and bounds from the file's symbols (a read
  /// of its ELF image, cached per file) and the IFUNC bindings (the dynamic
  /// linker's answers).
  full,
};

/// Describes a registered probe. Thread-safety: any thread, not in a handler.
/// @throws Error(Errc::conflict) when `probe` is not a registered probe.
ProbeInfo probe_info(const Uprobe* probe);

/// probe_info() to the depth `detail` says (ProbeDetail::full: the same as
/// probe_info(probe)). Thread-safety and errors as probe_info().
ProbeInfo probe_info(const Uprobe* probe, ProbeDetail detail);

/// What a probe at a file offset would be patched as, decided from the file
/// alone, without attaching anything (the plan step of an attach: the
/// kernel's arch_uprobe_analyze_insn() plus its optimizer's choice, and
/// libuprobe's windows).
struct SitePlan {
  /// optimized_nop5, optimized_entry, optimized_window or optimized_punned
  /// (when a page at the address its bytes select is free; an attach may pad
  /// it, optimized_padded, where that page is taken) when the site's
  /// shape takes a jump; int3 when it does not (why_int3 says why). An
  /// attached probe can still end int3 where the plan says a jump, for
  /// reasons of the moment (Config switches, another probe inside the
  /// window, a thread that cannot be observed outside it, no stub memory in
  /// reach): ProbeInfo::why_not_optimized says which.
  ProbeMode tactic = ProbeMode::int3;
  unsigned displaced = 0;    ///< bytes a window displaces (0 for nop5 and int3)
  std::string instruction;   ///< disassembly of the instruction at the offset
  std::string why_int3;      ///< why no jump ("" when tactic is not int3)
  std::string why_no_window;  ///< why no window (a punned jump or int3 instead), "" when one applies
};

/// Plans a probe at `offset` of the ELF file `path` (what register_uprobe()
/// would check and patch, minus the process's state). Thread-safety: any
/// thread, not in a handler. Not async-signal-safe.
/// @throws Error as register_uprobe() refuses the offset: file_not_found,
/// not_executable, bad_offset, mid_instruction, refused_instruction.
SitePlan plan_site(const std::string& path, std::uint64_t offset);

/// One function of known bounds in a file and its instructions.
struct FunctionSites {
  std::string name;              ///< the symbol's name, "" for bounds from an FDE alone
  std::uint64_t offset = 0;      ///< file offset of its entry
  std::uint64_t size = 0;        ///< bytes
  /// Offsets from the entry of every instruction a linear sweep from the
  /// entry decodes (stopping at the first undecodable byte).
  std::vector<std::uint32_t> starts;
};

/// Every function of known bounds in `path` (a sized symbol of .symtab,
/// .dynsym or the build-id debug file, or an .eh_frame FDE; aliases once),
/// in file order, with its instruction starts: the sites plan_site() and
/// uprobe-coverage --every-instruction take. Thread-safety: any thread.
/// @throws Error(file_not_found, not_executable) when the file cannot be read.
std::vector<FunctionSites> function_sites(const std::string& path);

}  // namespace uprobe
