/* SPDX-License-Identifier: MIT */
/* The program tests/trace runs under uprobe-trace. Every mode does an exactly
 * known number of calls and reports what it did with write(2) only (stdio
 * would call malloc behind the test's back):
 *   basic N M       trace_fn() N times, malloc()+free() M times
 *   wild            wc_alpha() 1x, wc_beta() 2x, wc_gamma() 3x, wcnot() 4x
 *   usdt K          K passes over a semaphore-guarded USDT probe (tracefix:guarded)
 *                   and an unguarded one (tracefix:plain); prints how many
 *                   passes found the semaphore set
 *   threads T N     T threads call trace_fn() N times each
 *   fork N          trace_fn() N times here, 2N times in a fork()ed child
 *   exec N          trace_fn() N times, then exec "basic 2N 0" (this program)
 *   sleepy K        trace_sleep() K times (each sleeps 1 ms)
 *   lost N          trace_fn() N times here, N times in a child that leaves with _exit()
 *   blocked N       trace_fn() N times with every signal blocked
 *   rawlost N       as lost, but the child leaves with the exit_group system call
 *   quickexit N     trace_fn() N times, then _exit(3)
 *   single N        trace_fn() N times, then prints single=1 when glibc still takes the
 *                   process for single-threaded (__libc_single_threaded: no thread was ever made)
 *   rawexit N       trace_fn() N times, then the exit_group system call (status 3)
 *   sigexit         one idle thread; the main thread mallocs and frees in a loop until
 *                   a SIGALRM handler (after 100 ms) calls _exit(3)
 *   execfail K      K execl() calls that fail, then exec "wild" (this program)
 *   killself N      trace_fn() N times, then SIGKILL to itself
 *   abort N         trace_fn() N times, then abort()
 *   block N         trace_fn() N times, prints fn=N, then waits for a signal forever
 *   sigprof N       trace_fn() N times while a SIGPROF every 100 us of CPU time calls it in its
 *                   handler too (landing inside a hit now and then); prints calls=ALL
 *   blockign N      as block, with SIGINT ignored
 *   rawfork N       trace_fn() N times here, 2N times in a child made by the fork system call
 *                   (no atfork handler runs in it) that leaves with the exit_group system call
 *   nofd N          trace_fn() N times, then (with RLIMIT_NOFILE 3: no file can be opened) 2N
 *                   times in a new thread
 *   vfork N         N vfork() children that _exit(5) at once; prints how many exited with 5
 *   vforksig N      a SIGUSR1 handler; a vfork() child resets it to SIG_DFL (as Python's
 *                   subprocess does) and _exit()s; then N raise(SIGUSR1): prints how many
 *                   times the handler ran
 *   fds             prints its open file descriptors (fds=0,1,2,...), from /proc/self/fd, the
 *                   number open() gives /dev/null (open=3), then a fork()ed child calls
 *                   trace_fn() once and prints its own (child fds=...); child_status=0
 */
#define _GNU_SOURCE
#define _SDT_HAS_SEMAPHORES 1
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <sys/resource.h>
#include <sys/single_threaded.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__extension__ unsigned short tracefix_guarded_semaphore __attribute__((unused, section(".probes"))) = 0;

volatile long sink;

#define NOINLINE __attribute__((noinline, noclone, used))

NOINLINE long trace_fn(long x) {
  __asm__ volatile("");
  return x * 2 + 1;
}
NOINLINE void wc_alpha(void) { __asm__ volatile(""); sink += 1; }
NOINLINE void wc_beta(void) { __asm__ volatile(""); sink += 2; }
NOINLINE void wc_gamma(void) { __asm__ volatile(""); sink += 3; }
NOINLINE void wcnot(void) { __asm__ volatile(""); sink += 4; }

NOINLINE void trace_sleep(void) {
  struct timespec ts = {0, 1000000};
  nanosleep(&ts, NULL);
}

void usdt_plain(long i); /* fixture_plain.c: no semaphore */

NOINLINE int usdt_pass(long i) {
  int guarded = 0;
  if (__builtin_expect(tracefix_guarded_semaphore != 0, 0)) {
    guarded = 1;
    STAP_PROBE1(tracefix, guarded, i);
  }
  usdt_plain(i);
  return guarded;
}

static void say(const char* key, long v) {
  char buf[64];
  char digits[24];
  int n = 0, len = 0;
  unsigned long u = v < 0 ? (unsigned long)-v : (unsigned long)v;
  do digits[n++] = (char)('0' + u % 10); while ((u /= 10) != 0);
  size_t k = strlen(key);
  memcpy(buf, key, k);
  len = (int)k;
  buf[len++] = '=';
  if (v < 0) buf[len++] = '-';
  while (n) buf[len++] = digits[--n];
  buf[len++] = '\n';
  if (write(1, buf, (size_t)len) < 0) _exit(3);
}

static long calls(long n) {
  long s = 0;
  for (long i = 0; i < n; i++) s += trace_fn(i);
  return s;
}

/* Writes `prefix` and the sorted numbers of /proc/self/fd (all but the
 * directory's own): "fds=0,1,2\n". 0, or -1 if the directory cannot be read. */
static int print_fds(const char* prefix) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  char line[512];
  size_t len = strlen(prefix);
  memcpy(line, prefix, len);
  int seen[256], n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d) || n == 256) continue;
    seen[n++] = atoi(e->d_name);
  }
  closedir(d);
  for (int i = 1; i < n; i++)  /* insertion sort: no qsort (no libc callbacks) */
    for (int j = i; j > 0 && seen[j - 1] > seen[j]; j--) {
      int t = seen[j];
      seen[j] = seen[j - 1];
      seen[j - 1] = t;
    }
  for (int i = 0; i < n && len < sizeof line - 16; i++) {
    char digits[16];
    int k = 0, v = seen[i];
    do digits[k++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    if (i) line[len++] = ',';
    while (k) line[len++] = digits[--k];
  }
  line[len++] = '\n';
  return write(1, line, len) == (ssize_t)len ? 0 : -1;
}

static long per_thread;
static pthread_barrier_t barrier;

static void* thread_main(void* arg) {
  (void)arg;
  pthread_barrier_wait(&barrier);
  sink += calls(per_thread);
  return NULL;
}

static void* idle_thread(void* arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static volatile sig_atomic_t usr1_runs;
static void count_usr1(int sig) {
  (void)sig;
  usr1_runs++;
}

/* A vfork() child that _exit(5)s at once, or (reset) resets SIGUSR1 to
 * SIG_DFL first and _exit(0)s. */
NOINLINE pid_t vfork_child(int reset) {
  pid_t p = vfork();
  if (p == 0) {
    if (!reset) _exit(5);
    signal(SIGUSR1, SIG_DFL);
    _exit(0);
  }
  return p;
}

static void exit_on_alarm(int sig) {
  (void)sig;
  _exit(3);
}

static volatile sig_atomic_t prof_calls;
static void on_prof(int sig) {
  (void)sig;
  sink += trace_fn(1);
  prof_calls = prof_calls + 1;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* mode = argv[1];
  long a = argc > 2 ? atol(argv[2]) : 0, b = argc > 3 ? atol(argv[3]) : 0;
  if (!strcmp(mode, "basic")) {
    sink += calls(a);
    long m = 0;
    for (long i = 0; i < b; i++) {
      char* p = malloc((size_t)(16 + i % 64));
      if (!p) return 1;
      p[0] = (char)i;
      sink += p[0];
      free(p);
      m++;
    }
    say("fn", a);
    say("malloc", m);
  } else if (!strcmp(mode, "sigprof")) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_prof;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{0, 100}, {0, 100}};
    setitimer(ITIMER_PROF, &it, NULL);
    sink += calls(a);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    say("calls", a + prof_calls);
  } else if (!strcmp(mode, "wild")) {
    wc_alpha();
    for (int i = 0; i < 2; i++) wc_beta();
    for (int i = 0; i < 3; i++) wc_gamma();
    for (int i = 0; i < 4; i++) wcnot();
  } else if (!strcmp(mode, "usdt")) {
    long g = 0;
    for (long i = 0; i < a; i++) g += usdt_pass(i);
    say("guarded", g);
  } else if (!strcmp(mode, "threads")) {
    per_thread = b;
    pthread_t t[64];
    if (a < 1 || a > 64) return 2;
    pthread_barrier_init(&barrier, NULL, (unsigned)a);
    for (long i = 0; i < a; i++) pthread_create(&t[i], NULL, thread_main, NULL);
    for (long i = 0; i < a; i++) pthread_join(t[i], NULL);
  } else if (!strcmp(mode, "fork")) {
    sink += calls(a);
    pid_t p = fork();
    if (p == 0) {
      sink += calls(2 * a);
      exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    say("child_status", st);
  } else if (!strcmp(mode, "exec")) {
    sink += calls(a);
    char n2[32];
    long v = 2 * a;
    int len = 0;
    char d[24];
    int k = 0;
    do d[k++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    while (k) n2[len++] = d[--k];
    n2[len] = 0;
    execl("/proc/self/exe", argv[0], "basic", n2, "0", (char*)NULL);
    return 4;
  } else if (!strcmp(mode, "lost")) {
    sink += calls(a);
    pid_t p = fork();
    if (p == 0) {
      sink += calls(a);
      _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
  } else if (!strcmp(mode, "rawlost")) {
    sink += calls(a);
    pid_t p = fork();
    if (p == 0) {
      sink += calls(a);
      syscall(SYS_exit_group, 0);
    }
    int st = 0;
    waitpid(p, &st, 0);
  } else if (!strcmp(mode, "single")) {
    sink += calls(a);
    say("fn", a);
    say("single", __libc_single_threaded);
  } else if (!strcmp(mode, "crashorphan")) {
    // A child does its calls, says so, and waits forever (a read of a pipe
    // it holds both ends of; its standard files on /dev/null, as a worker
    // left behind by a crash has nobody to talk to); then the program aborts.
    int sync[2], never[2];
    if (pipe(sync) || pipe(never)) return 5;
    const pid_t c = fork();
    if (c < 0) return 5;
    char b = 1;
    if (c == 0) {
      sink += calls(a);
      const int null = open("/dev/null", O_RDWR);
      dup2(null, 0), dup2(null, 1), dup2(null, 2);
      if (write(sync[1], &b, 1) != 1) _exit(5);
      if (read(never[0], &b, 1) != 1) _exit(6);
      _exit(0);
    }
    if (read(sync[0], &b, 1) != 1) return 5;
    sink += calls(a);
    abort();
  } else if (!strcmp(mode, "quickexit")) {
    sink += calls(a);
    _exit(3);
  } else if (!strcmp(mode, "sigexit")) {
    pthread_t idle;
    pthread_create(&idle, NULL, idle_thread, NULL);
    signal(SIGALRM, exit_on_alarm);
    struct itimerval t = {{0, 0}, {0, 100000}};
    setitimer(ITIMER_REAL, &t, NULL);
    for (;;) {
      void* volatile p = malloc(5000);
      void* volatile q = malloc(100000);
      free(p);
      free(q);
    }
  } else if (!strcmp(mode, "rawexit")) {
    sink += calls(a);
    syscall(SYS_exit_group, 3);
  } else if (!strcmp(mode, "execfail")) {
    for (long i = 0; i < a; i++) execl("/nonexistent/trace-fixture", "x", (char*)NULL);
    execl("/proc/self/exe", argv[0], "wild", (char*)NULL);
    return 4;
  } else if (!strcmp(mode, "blocked")) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    sink += calls(a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    say("fn", a);
  } else if (!strcmp(mode, "killself")) {
    sink += calls(a);
    kill(getpid(), SIGKILL);
  } else if (!strcmp(mode, "abort")) {
    sink += calls(a);
    abort();
  } else if (!strcmp(mode, "block") || !strcmp(mode, "blockign")) {
    if (mode[5] == 'i') signal(SIGINT, SIG_IGN);
    sink += calls(a);
    say("fn", a);
    for (;;) pause();
  } else if (!strcmp(mode, "rawfork")) {
    sink += calls(a);
    long p = syscall(SYS_fork);
    if (p == 0) {
      sink += calls(2 * a);
      syscall(SYS_exit_group, 0);
    }
    int st = 0;
    waitpid((pid_t)p, &st, 0);
    say("child_status", st);
  } else if (!strcmp(mode, "nofd")) {
    sink += calls(a);
    struct rlimit rl = {3, 3};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 5;
    per_thread = 2 * a;
    pthread_barrier_init(&barrier, NULL, 1);
    pthread_t t;
    if (pthread_create(&t, NULL, thread_main, NULL) != 0) return 6;
    pthread_join(t, NULL);
  } else if (!strcmp(mode, "vfork")) {
    long fives = 0;
    for (long i = 0; i < a; i++) {
      pid_t p = vfork_child(0);
      int st = 0;
      if (p > 0 && waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 5) fives++;
    }
    say("vforked", fives);
  } else if (!strcmp(mode, "vforksig")) {
    signal(SIGUSR1, count_usr1);
    pid_t p = vfork_child(1);
    int st = 0;
    waitpid(p, &st, 0);
    for (long i = 0; i < a; i++) raise(SIGUSR1);
    say("usr1", usr1_runs);
  } else if (!strcmp(mode, "fds")) {
    if (print_fds("fds=") != 0) return 5;
    int fd = open("/dev/null", O_RDONLY);
    say("open", fd);
    if (fd >= 0) close(fd);
    pid_t p = fork();
    if (p == 0) {
      sink += calls(1);
      _exit(print_fds("child fds=") != 0 ? 5 : 0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    say("child_status", st);
  } else if (!strcmp(mode, "sleepy")) {
    for (long i = 0; i < a; i++) trace_sleep();
  } else {
    return 2;
  }
  return 0;
}
