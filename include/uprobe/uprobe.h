/* SPDX-License-Identifier: MIT */
#ifndef UPROBE_UPROBE_H
#define UPROBE_UPROBE_H
/**
 * @file uprobe.h
 * libuprobe C API, for C programs and other languages' FFIs. The C++ API
 * (uprobe/uprobe.hpp) is the primary one; this is a thin layer over it, shaped
 * like the kernel's include/linux/uprobes.h:
 *
 *   kernel                                   libuprobe
 *   struct uprobe_consumer {handler, ...}    struct uprobe_consumer (same callbacks, plus user_data)
 *   struct pt_regs                           struct uprobe_regs (same order)
 *   uprobe_register(inode, offset, 0, uc)    uprobe_register(path, offset, uc, &probe)
 *   uprobe_register(inode, offset, ref_ctr_offset, uc)
 *                                            uprobe_register_ref_ctr(path, offset, ref_ctr_offset, uc, &probe)
 *   uprobe_unregister(uprobe, uc)            uprobe_unregister(probe, uc)
 *   UPROBE_HANDLER_REMOVE                    UPROBE_HANDLER_REMOVE
 *
 * Errors are negative errno values (the table below; uprobe_strerror());
 * uprobe_last_error() has the full message of the calling thread's last
 * failure (path, offset, reason). A refused request changes nothing in the
 * process. No C++ exception ever leaves these functions.
 *
 * Link with -luprobe (pkg-config --libs uprobe). x86-64 Linux only.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#if defined(__GNUC__)
#define UPROBE_API __attribute__((visibility("default")))
#else
#define UPROBE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/**
 * User registers at a probe hit, layout-identical to uprobe::Regs (the
 * kernel's x86-64 struct pt_regs order minus the segment and orig_ax slots).
 * rip is the probed instruction's address at handler time. Every field is
 * writable from a handler: writing rip redirects execution there (the probed
 * instruction is then not executed), writing a GPR or rflags changes what the
 * probed instruction and the code after it see (only the arithmetic, direction
 * and trap flags of rflags are honoured). Integer arguments at a function's
 * entry: rdi, rsi, rdx, rcx, r8, r9; return value: rax.
 */
struct uprobe_regs {
  uint64_t r15, r14, r13, r12, rbp, rbx, r11, r10;
  uint64_t r9, r8, rax, rcx, rdx, rsi, rdi;
  uint64_t rip, rflags, rsp;
};

/** Handler return value: this consumer wants no more hits at this probe (see handler). */
#define UPROBE_HANDLER_REMOVE 1
/** Entry handler return value of a session consumer: no return call for this invocation (UPROBE_HANDLER_IGNORE). */
#define UPROBE_HANDLER_IGNORE 2

/**
 * A registered probe site, keyed by (st_dev, st_ino, file offset): the
 * kernel's struct uprobe. Opaque; valid while a consumer is registered on it.
 * (Not named `struct uprobe`: that would clash with the C++ namespace uprobe
 * in programs that include both headers.)
 */
struct uprobe_probe;

/**
 * A probe consumer: the kernel's struct uprobe_consumer. Zero-initialise it,
 * set the callbacks you need and user_data, then register it. One consumer
 * may be registered on many probes, at most once on the same probe; it must
 * stay valid (same address, callbacks unchanged) until its last
 * uprobe_unregister() has returned.
 *
 * Callbacks run on the hitting thread in signal context (SIGTRAP): they must
 * be async-signal-safe (no malloc, no stdio, no locks the probed thread may
 * hold). A probe hit inside a callback does not call callbacks again.
 */
struct uprobe_consumer {
  /**
   * Called before the probed instruction runs, with that thread's registers
   * (readable and writable). `cookie` points to a 64-bit value that starts at
   * 0 for every hit (the kernel's `__u64 *data`; a session consumer's
   * ret_handler of the same invocation sees the same value).
   * Return 0 to stay attached, or UPROBE_HANDLER_REMOVE: this consumer is not
   * called at this probe again until unregistered and registered anew, and
   * when every consumer of the probe has said remove, the breakpoint is taken
   * out (the registration itself stays until uprobe_unregister()). Other
   * values are reserved and currently mean 0; a consumer with a ret_handler
   * may return UPROBE_HANDLER_IGNORE. Optional when ret_handler is set.
   */
  int (*handler)(struct uprobe_consumer *self, struct uprobe_regs *regs, uint64_t *cookie);
  /**
   * Optional return handler (the kernel's ret_handler): called when an
   * invocation of the probed function returns (the probe must be at the
   * function's entry). `regs` holds the registers as the function left them
   * (rax/rdx: return value; rip: where it returns to); writes take effect.
   * `func` is the probed address. A consumer with both handler and
   * ret_handler is a session: `*cookie` written by handler at entry is what
   * ret_handler of the same invocation reads, and a handler returning
   * UPROBE_HANDLER_IGNORE gets no return call for that invocation. The
   * return value is ignored (reserved). At least one of handler and
   * ret_handler must be set.
   */
  int (*ret_handler)(struct uprobe_consumer *self, uint64_t func, struct uprobe_regs *regs, uint64_t *cookie);
  /**
   * Optional per-thread filter: return false and this consumer is not called
   * for hits by thread `tid` (the kernel's filter is per mm; in process the
   * unit is the thread). Called on every hit before handler, in the same
   * signal context. NULL: every thread.
   */
  bool (*filter)(struct uprobe_consumer *self, pid_t tid);
  /** The caller's pointer, for the callbacks (libuprobe never touches it). */
  void *user_data;
};

/**
 * Errors, as negative return values (uprobe::Errc in the C++ API):
 *   -ENOENT      the file does not exist (Errc::file_not_found);
 *                uprobe_unregister(): the consumer is not registered on that probe
 *   -EACCES, -ENOTDIR, -ELOOP, ...  open(2)/stat(2) of the path failed with that errno
 *                (file_not_found with Error::sys_errno(); an errno that has a meaning in
 *                this table is not passed through: the Errc's value instead)
 *   -EISDIR      the path is a directory (not_executable)
 *   -EINVAL      offset past the end of the file (bad_offset); a NULL argument;
 *                a consumer without a handler
 *   -ENOEXEC     not a regular file (a FIFO, a device), not an ELF file, or offset outside
 *                every executable segment of the file (not_executable)
 *   -EILSEQ      offset inside an instruction of a known function (mid_instruction)
 *   -EOPNOTSUPP  an int3 already there, undecodable bytes, an instruction that cannot
 *                run out of line (refused_instruction); a ret_handler at an offset
 *                that is inside a known function but not its entry
 *   -ENXIO       the address is in anonymous memory or in no mapping (not_file_backed)
 *   -EPERM       libuprobe's own code or its trap-path dependencies; any target when
 *                libuprobe was loaded after libc (forbidden_target)
 *   -EEXIST      this consumer is already registered on this probe (conflict)
 *   -EBUSY       the probe is registered with another USDT semaphore: every consumer of a
 *                probe names the same ref_ctr_offset, 0 for none (ref_ctr_conflict)
 *   -EUSERS      the probe has 10 consumers with a ret_handler already, the most one
 *                return instance records (too_many_return_consumers)
 *   -EDEADLK     called from inside a probe handler (in_handler), or from a pthread_atfork
 *                handler while that thread's fork() holds libuprobe's locks
 *   -EIO         a system call failed (system; the message names it and its errno)
 *   -ENOMEM      out of memory
 *   -ERANGE      uprobe_resolve_address(): the path does not fit the buffer
 */

/**
 * Registers `uc` on the instruction at file offset `offset` of the file
 * `path` (the kernel's uprobe_register()). The probe applies to every
 * executable mapping of that file in this process. On success stores the
 * probe in *probe and returns 0; else returns a negative errno and changes
 * nothing. Any thread, concurrently with hits and other (un)registrations; not
 * from a handler (-EDEADLK). Not async-signal-safe.
 */
UPROBE_API int uprobe_register(const char *path, uint64_t offset, struct uprobe_consumer *uc,
                               struct uprobe_probe **probe);

/**
 * Same, with a USDT semaphore (the kernel's uprobe_register(inode, offset,
 * ref_ctr_offset, uc)): `ref_ctr_offset` is the file offset of the 16-bit
 * count the probe's is-enabled check reads (0: none, as uprobe_register()).
 * While `uc` is registered the count is one higher in every mapping of the
 * file that holds it (mappings that appear later through dlopen() too);
 * uprobe_unregister() takes the increment back, never below 0. Every
 * consumer of one probe names the same ref_ctr_offset: another one is
 * refused with -EBUSY and nothing changes (no count moves). Errors and
 * thread-safety as uprobe_register().
 */
UPROBE_API int uprobe_register_ref_ctr(const char *path, uint64_t offset, uint64_t ref_ctr_offset,
                                       struct uprobe_consumer *uc, struct uprobe_probe **probe);

/**
 * Same, with the probe site given as an address in this process (the mapping
 * that holds it gives the file and offset, as uprobe_resolve_address()).
 * Note that in a non-PIE executable &libc_function may be the executable's
 * PLT stub; dlsym(RTLD_NEXT, "name") gives the library's code.
 */
UPROBE_API int uprobe_register_addr(const void *addr, struct uprobe_consumer *uc, struct uprobe_probe **probe);

/**
 * Unregisters `uc` from `probe` (the kernel's uprobe_unregister()). Returns 0
 * when no thread can still be running a callback of `uc` for this probe (an
 * RCU grace period); when the last consumer goes, the original bytes are
 * restored and `probe` becomes invalid. Errors: -ENOENT (not registered),
 * -EINVAL (NULL argument), -EDEADLK (from a handler).
 */
UPROBE_API int uprobe_unregister(struct uprobe_probe *probe, struct uprobe_consumer *uc);

/**
 * One probe of a batch (uprobe_register_batch(), uprobe_unregister_batch()).
 * In: the probe site as `path` + `offset`, or as `addr` (an address in this
 * process; used when not NULL, `path` is then ignored), the consumer `uc` and
 * an optional USDT semaphore `ref_ctr_offset` (file offset, 0 = none; path
 * form only). Out: `probe` and `err`.
 */
struct uprobe_request {
  const char *path;
  uint64_t offset;
  const void *addr;
  uint64_t ref_ctr_offset;
  struct uprobe_consumer *uc;
  /** Out (register): the probe, NULL on error. In (unregister): the probe. */
  struct uprobe_probe *probe;
  /** Out: 0, or this request's negative errno (the table above). */
  int err;
};

/**
 * Registers `n` requests as one batch: one read of the address space, one
 * open and ELF read per file, one publication of the probe table (the C++
 * register_uprobes() of uprobe/batch.hpp). Each request gets its own outcome
 * in reqs[i].probe and reqs[i].err, as if registered by its own
 * uprobe_register() call in order; a failed request changes nothing and does
 * not affect the others. Returns the number of failed requests (0: all
 * registered), or a negative errno when the call itself is refused (-EINVAL:
 * reqs is NULL with n > 0; -EDEADLK: from a handler, every err set too;
 * -ENOMEM). uprobe_last_error() then describes the first failed request. Any
 * thread; not from a handler; not async-signal-safe.
 */
UPROBE_API int uprobe_register_batch(struct uprobe_request *reqs, size_t n);

/**
 * Unregisters reqs[i].uc from reqs[i].probe for every i as one batch (one RCU
 * grace period for all; the original bytes of every site left without a
 * consumer are restored before it returns). Sets reqs[i].err (0, -ENOENT: not
 * registered, -EINVAL: NULL probe or consumer). Returns the number of failed
 * requests, or a negative errno for the call as uprobe_register_batch().
 */
UPROBE_API int uprobe_unregister_batch(struct uprobe_request *reqs, size_t n);

/**
 * The file and file offset mapped at `addr` in this process. Writes the
 * NUL-terminated path into path[0..path_size) and the offset into *offset
 * (either may be NULL/0 to skip). Returns 0, -ENXIO (anonymous memory or no
 * mapping) or -ERANGE (path_size too small; nothing written to path).
 * Any thread; not async-signal-safe (reads /proc/self/maps).
 */
UPROBE_API int uprobe_resolve_address(const void *addr, char *path, size_t path_size, uint64_t *offset);

/**
 * A short description of a libuprobe error value (negative or positive errno),
 * in libuprobe's terms. Static storage; never NULL. Async-signal-safe.
 */
UPROBE_API const char *uprobe_strerror(int err);

/**
 * The full message of the calling thread's last failed libuprobe call
 * ("libuprobe: cannot probe /path at offset 0x...: reason"), or "" if none
 * failed yet. Successful calls leave it unchanged (like errno). The pointer
 * is valid until the thread's next failing libuprobe call.
 */
UPROBE_API const char *uprobe_last_error(void);

/** True while the calling thread runs a libuprobe handler. Async-signal-safe. */
UPROBE_API bool uprobe_in_handler(void);

/** The library version, "major.minor.patch". */
UPROBE_API const char *uprobe_version(void);

#ifdef __cplusplus
}
#endif

#endif /* UPROBE_UPROBE_H */
