/* SPDX-License-Identifier: MIT */
/* How many times each stage of trace_early (early_main.c, early_lib.c) and
 * trace_initfirst (initfirst_main.c, initfirst_lib.c) calls its probed
 * function: distinct values, so that a wrong total names the stage. Also
 * included by trace_test.cpp. */
#ifndef TRACE_EARLY_H
#define TRACE_EARLY_H

#define EARLY_PREINIT 2   /* trace_early's DT_PREINIT_ARRAY */
#define EARLY_LIB_CTOR 3  /* libtrace_early.so's constructor (a DT_NEEDED of trace_early) */
#define EARLY_CTOR 5      /* trace_early's own constructor */
#define EARLY_ATEXIT 7    /* an atexit() handler of main */
#define EARLY_DTOR 11     /* trace_early's destructor */
#define EARLY_LIB_DTOR 13 /* libtrace_early.so's destructor */

#define INITFIRST_LIB_CTOR 17 /* libtrace_initfirst.so's constructor (DF_1_INITFIRST: before the agent's) */
#define INITFIRST_LIB_DTOR 19 /* its destructor */

#ifdef __cplusplus
extern "C" {
#endif
long early_fn(long x);     /* libtrace_early.so */
long initfirst_fn(long x); /* libtrace_initfirst.so */
#ifdef __cplusplus
}
#endif

#endif
