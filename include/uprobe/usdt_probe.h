/* SPDX-License-Identifier: MIT */
#ifndef UPROBE_USDT_PROBE_H
#define UPROBE_USDT_PROBE_H
/*
 * usdt_probe.h: USDT probe points in C and C++ (GCC or Clang, x86-64), with
 * the note layout of <sys/sdt.h> (SystemTap v3 notes: section .note.stapsdt,
 * owner "stapsdt", type 3, the _.stapsdt.base anchor in .stapsdt.base, the
 * semaphore in .probes), so readelf -n, bpftrace, libbpf, perf, gdb, the
 * kernel's ref_ctr_offset and uprobe::usdt read them like sys/sdt.h probes.
 *
 * The difference: the probe site is the 5-byte nop `0f 1f 44 00 00`
 * (nopl 0x0(%rax,%rax,1)) instead of sys/sdt.h's 1-byte `90`, so a probe
 * there can be a `jmp rel32` to a trampoline (an optimized probe) instead of
 * an int3 trap.
 *
 *   UPROBE_USDT_PROBE(provider, name, args...)       a probe, 0 to 12 arguments
 *   UPROBE_USDT_PROBE_SEMA(provider, name, args...)  the same, with a semaphore
 *   UPROBE_USDT_DEFINE_SEMAPHORE(provider, name);    defines provider_name_semaphore
 *                                                    (in one file, at global scope)
 *   UPROBE_USDT_DECLARE_SEMAPHORE(provider, name);   declares it (in other files)
 *   UPROBE_USDT_PROBE_ENABLED(provider, name)        non-zero while a tracer is attached
 *
 * provider and name are identifiers (as in sys/sdt.h; `__` in a name reads as
 * `-` to DTrace-style tools). Arguments are integers, pointers, arrays (their
 * address), enums or floating-point values; each is described as SIZE@OPERAND
 * where SIZE is its size in bytes, negative when signed, followed by `f` for
 * floating point (as sys/sdt.h >= 4.3 does), and OPERAND the assembler operand
 * the compiler chose (constraint "nor": a constant `$N`, a register `%eax`, or
 * a memory operand `-20(%rbp)`, `sym(%rip)`).
 *
 * The semaphore is an `unsigned short` in section .probes that a tracer
 * increments while it is attached (the kernel's ref_ctr; libuprobe's USDT
 * attach does the same): guard expensive argument computation with
 *
 *   if (UPROBE_USDT_PROBE_ENABLED(myapp, request))
 *     UPROBE_USDT_PROBE_SEMA(myapp, request, compute_id(), len);
 *
 * The semaphore is hidden (one per executable or shared object) and is named
 * in assembler text, so it must be defined at global scope (not inside a C++
 * namespace). Probes in code that is never emitted leave no note.
 */

#if !defined(__x86_64__)
#error "uprobe/usdt_probe.h supports x86-64 only"
#endif

/* ----------------------------------------------------------- semaphores -- */

#define UPROBE_USDT_SEMAPHORE(provider, name) provider##_##name##_semaphore

#define UPROBE_USDT_DECLARE_SEMAPHORE(provider, name) \
  extern __attribute__((visibility("hidden"))) volatile unsigned short provider##_##name##_semaphore

#define UPROBE_USDT_DEFINE_SEMAPHORE(provider, name)                                    \
  __attribute__((section(".probes"), used, visibility("hidden"))) volatile unsigned short \
      provider##_##name##_semaphore = 0

/* A relaxed atomic load (a plain 2-byte load on x86): libuprobe, in this
 * process, increments the semaphore atomically while other threads read it. */
#define UPROBE_USDT_PROBE_ENABLED(provider, name) \
  __builtin_expect(__atomic_load_n(&provider##_##name##_semaphore, __ATOMIC_RELAXED) != 0, 0)

/* ------------------------------------------------- argument description -- */

#ifdef __cplusplus
#include <type_traits>
template <typename _UprobeT>
struct _uprobe_usdt_arg {
  typedef typename std::decay<_UprobeT>::type _D;
  static constexpr bool _float = std::is_floating_point<_D>::value;
  static constexpr bool _signed = std::is_integral<_D>::value && std::is_signed<_D>::value;
  static constexpr int _size = std::is_pointer<_D>::value ? static_cast<int>(sizeof(void*)) : static_cast<int>(sizeof(_D));
  static constexpr int _ssize = _signed ? -_size : _size;
};
#define _UPROBE_USDT_SSIZE(x) (_uprobe_usdt_arg<decltype(x)>::_ssize)
#define _UPROBE_USDT_FLOAT(x) (_uprobe_usdt_arg<decltype(x)>::_float ? 1 : 0)
#else
/* __builtin_classify_type: 1..4 integer, char, enum, bool; 5 pointer; 8 real; 14 array. */
#define _UPROBE_USDT_PTR(x) (__builtin_classify_type(x) == 5 || __builtin_classify_type(x) == 14)
#define _UPROBE_USDT_INTTYPE(x) \
  __typeof__(__builtin_choose_expr(((__builtin_classify_type(x) + 3) & -4) == 4, (x), 0U))
#define _UPROBE_USDT_SIGNED(x) \
  (!_UPROBE_USDT_PTR(x) && ((_UPROBE_USDT_INTTYPE(x)) - 1 < (_UPROBE_USDT_INTTYPE(x))1))
#define _UPROBE_USDT_SIZE(x) ((int)(_UPROBE_USDT_PTR(x) ? sizeof(void*) : sizeof(x)))
#define _UPROBE_USDT_SSIZE(x) (_UPROBE_USDT_SIGNED(x) ? -_UPROBE_USDT_SIZE(x) : _UPROBE_USDT_SIZE(x))
#define _UPROBE_USDT_FLOAT(x) (__builtin_classify_type(x) == 8 ? 1 : 0)
#endif

/* One argument: "SIZE[f]@OPERAND" from two asm operands (GCC allows 30 per
 * asm statement): a code (the signed size, + 100 for floating point) that the
 * assembler turns into text, and the operand. */
#define _UPROBE_USDT_CODE(x) (_UPROBE_USDT_SSIZE(x) + 100 * _UPROBE_USDT_FLOAT(x))
#define _UPROBE_USDT_TARG(i)                                                                    \
  ".if %c[_uprobe_k" #i "] == 104\n.ascii \"4f@\"\n"                                        \
  ".elseif %c[_uprobe_k" #i "] == 108\n.ascii \"8f@\"\n"                                    \
  ".elseif %c[_uprobe_k" #i "] >= 100\n"                                                     \
  ".error \"uprobe/usdt_probe.h: unsupported floating-point argument size\"\n"               \
  ".else\n.ascii \"%c[_uprobe_k" #i "]@\"\n.endif\n"                                        \
  ".ascii \"%[_uprobe_a" #i "]\"\n"
#define _UPROBE_USDT_SP ".ascii \" \"\n"
#define _UPROBE_USDT_OPND(i, x) [_uprobe_k##i] "n"(_UPROBE_USDT_CODE(x)), [_uprobe_a##i] "nor"(x)

#define _UPROBE_USDT_T0 ""
#define _UPROBE_USDT_T1 _UPROBE_USDT_TARG(1)
#define _UPROBE_USDT_T2 _UPROBE_USDT_T1 _UPROBE_USDT_SP _UPROBE_USDT_TARG(2)
#define _UPROBE_USDT_T3 _UPROBE_USDT_T2 _UPROBE_USDT_SP _UPROBE_USDT_TARG(3)
#define _UPROBE_USDT_T4 _UPROBE_USDT_T3 _UPROBE_USDT_SP _UPROBE_USDT_TARG(4)
#define _UPROBE_USDT_T5 _UPROBE_USDT_T4 _UPROBE_USDT_SP _UPROBE_USDT_TARG(5)
#define _UPROBE_USDT_T6 _UPROBE_USDT_T5 _UPROBE_USDT_SP _UPROBE_USDT_TARG(6)
#define _UPROBE_USDT_T7 _UPROBE_USDT_T6 _UPROBE_USDT_SP _UPROBE_USDT_TARG(7)
#define _UPROBE_USDT_T8 _UPROBE_USDT_T7 _UPROBE_USDT_SP _UPROBE_USDT_TARG(8)
#define _UPROBE_USDT_T9 _UPROBE_USDT_T8 _UPROBE_USDT_SP _UPROBE_USDT_TARG(9)
#define _UPROBE_USDT_T10 _UPROBE_USDT_T9 _UPROBE_USDT_SP _UPROBE_USDT_TARG(10)
#define _UPROBE_USDT_T11 _UPROBE_USDT_T10 _UPROBE_USDT_SP _UPROBE_USDT_TARG(11)
#define _UPROBE_USDT_T12 _UPROBE_USDT_T11 _UPROBE_USDT_SP _UPROBE_USDT_TARG(12)

#define _UPROBE_USDT_O0()
#define _UPROBE_USDT_O1(a1) _UPROBE_USDT_OPND(1, a1)
#define _UPROBE_USDT_O2(a1, a2) _UPROBE_USDT_O1(a1), _UPROBE_USDT_OPND(2, a2)
#define _UPROBE_USDT_O3(a1, a2, a3) _UPROBE_USDT_O2(a1, a2), _UPROBE_USDT_OPND(3, a3)
#define _UPROBE_USDT_O4(a1, a2, a3, a4) _UPROBE_USDT_O3(a1, a2, a3), _UPROBE_USDT_OPND(4, a4)
#define _UPROBE_USDT_O5(a1, a2, a3, a4, a5) _UPROBE_USDT_O4(a1, a2, a3, a4), _UPROBE_USDT_OPND(5, a5)
#define _UPROBE_USDT_O6(a1, a2, a3, a4, a5, a6) _UPROBE_USDT_O5(a1, a2, a3, a4, a5), _UPROBE_USDT_OPND(6, a6)
#define _UPROBE_USDT_O7(a1, a2, a3, a4, a5, a6, a7) \
  _UPROBE_USDT_O6(a1, a2, a3, a4, a5, a6), _UPROBE_USDT_OPND(7, a7)
#define _UPROBE_USDT_O8(a1, a2, a3, a4, a5, a6, a7, a8) \
  _UPROBE_USDT_O7(a1, a2, a3, a4, a5, a6, a7), _UPROBE_USDT_OPND(8, a8)
#define _UPROBE_USDT_O9(a1, a2, a3, a4, a5, a6, a7, a8, a9) \
  _UPROBE_USDT_O8(a1, a2, a3, a4, a5, a6, a7, a8), _UPROBE_USDT_OPND(9, a9)
#define _UPROBE_USDT_O10(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10) \
  _UPROBE_USDT_O9(a1, a2, a3, a4, a5, a6, a7, a8, a9), _UPROBE_USDT_OPND(10, a10)
#define _UPROBE_USDT_O11(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11) \
  _UPROBE_USDT_O10(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10), _UPROBE_USDT_OPND(11, a11)
#define _UPROBE_USDT_O12(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12) \
  _UPROBE_USDT_O11(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11), _UPROBE_USDT_OPND(12, a12)

/* ------------------------------------------------------------ the note -- */

#define _UPROBE_USDT_S(x) #x
#define _UPROBE_USDT_STR(x) _UPROBE_USDT_S(x)

#define _UPROBE_USDT_SEMA0(provider, name) ".8byte 0\n"
#define _UPROBE_USDT_SEMA1(provider, name) ".8byte " _UPROBE_USDT_STR(provider##_##name##_semaphore) "\n"
#define _UPROBE_USDT_USE0(provider, name)
#define _UPROBE_USDT_USE1(provider, name) __asm__ __volatile__("" ::"m"(provider##_##name##_semaphore));

#define _UPROBE_USDT_TEXT(provider, name, sema, tmpl)                              \
  "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"                                      \
  ".pushsection .note.stapsdt,\"?\",\"note\"\n"                                    \
  ".balign 4\n"                                                                    \
  ".4byte 992f-991f, 994f-993f, 3\n"                                               \
  "991: .asciz \"stapsdt\"\n"                                                      \
  "992: .balign 4\n"                                                               \
  "993: .8byte 990b\n"                                                             \
  ".8byte _.stapsdt.base\n" _UPROBE_USDT_SEMA##sema(provider, name)                \
  ".asciz \"" #provider "\"\n"                                                     \
  ".asciz \"" #name "\"\n" tmpl                                                    \
  ".ascii \"\\0\"\n"                                                               \
  "994: .balign 4\n"                                                               \
  ".popsection\n"                                                                  \
  ".ifndef _.stapsdt.base\n"                                                       \
  ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"          \
  ".weak _.stapsdt.base\n"                                                         \
  ".hidden _.stapsdt.base\n"                                                       \
  "_.stapsdt.base: .space 1\n"                                                     \
  ".size _.stapsdt.base, 1\n"                                                      \
  ".popsection\n"                                                                  \
  ".endif\n"

#define _UPROBE_USDT_PROBE_N2(provider, name, sema, n, ...)                                     \
  do {                                                                                          \
    _UPROBE_USDT_USE##sema(provider, name)                                                     \
    __asm__ __volatile__(_UPROBE_USDT_TEXT(provider, name, sema, _UPROBE_USDT_T##n)::_UPROBE_USDT_O##n(__VA_ARGS__)); \
  } while (0)
#define _UPROBE_USDT_PROBE_N(provider, name, sema, n, ...) _UPROBE_USDT_PROBE_N2(provider, name, sema, n, __VA_ARGS__)

#define _UPROBE_USDT_NARG(...) _UPROBE_USDT_NARG_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define _UPROBE_USDT_NARG_(_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, N, ...) N

/* ------------------------------------------------------------ the API ---- */

#define UPROBE_USDT_PROBE(provider, name, ...) \
  _UPROBE_USDT_PROBE_N(provider, name, 0, _UPROBE_USDT_NARG(0, ##__VA_ARGS__), ##__VA_ARGS__)

#define UPROBE_USDT_PROBE_SEMA(provider, name, ...) \
  _UPROBE_USDT_PROBE_N(provider, name, 1, _UPROBE_USDT_NARG(0, ##__VA_ARGS__), ##__VA_ARGS__)

#endif /* UPROBE_USDT_PROBE_H */
