/* pkg.c_api: the C API (include/uprobe/uprobe.h) against the in-tree
 * libuprobe.so: callbacks, user data, registers, UPROBE_HANDLER_REMOVE,
 * filters, (path, offset) and address registration, and every error value.
 * Plain C with a minimal CHECK macro; exits non-zero on any failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uprobe/uprobe.h>
#include <uprobe/usdt_probe.h>

static int failures;
#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, \
              #cond, uprobe_last_error());                                            \
      failures++;                                                                     \
    }                                                                                 \
  } while (0)
#define CHECK_RC(expr, want)                                                                          \
  do {                                                                                                \
    int rc_ = (expr);                                                                                 \
    if (rc_ != (want)) {                                                                              \
      fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d (%s); last error: %s\n", __FILE__, __LINE__, \
              #expr, rc_, uprobe_strerror(rc_), (want), uprobe_strerror(want), uprobe_last_error());      \
      failures++;                                                                                     \
    }                                                                                                 \
  } while (0)

/* Fixtures with known first instructions; only this file calls them. */
__asm__(
    ".text\n"
    ".globl pkg_fixture_add1\n"
    ".type pkg_fixture_add1, @function\n"
    "pkg_fixture_add1:\n"
    "  movq %rdi, %rax\n" /* 3 bytes: +1 is inside an instruction */
    "  addq $1, %rax\n"
    "  ret\n"
    ".size pkg_fixture_add1, .-pkg_fixture_add1\n"
    ".globl pkg_fixture_add2\n"
    ".type pkg_fixture_add2, @function\n"
    "pkg_fixture_add2:\n"
    "  leaq 2(%rdi), %rax\n"
    "  ret\n"
    ".size pkg_fixture_add2, .-pkg_fixture_add2\n"
    ".globl pkg_fixture_int3\n"
    ".type pkg_fixture_int3, @function\n"
    "pkg_fixture_int3:\n"
    "  int3\n"
    "  ret\n"
    ".size pkg_fixture_int3, .-pkg_fixture_int3\n");
long pkg_fixture_add1(long);
long pkg_fixture_add2(long);
void pkg_fixture_int3(void);

static const char rodata_fixture[64] = "not code";

#define ADDR(f) ((const void *)(uintptr_t)&(f))

/* A consumer with counters; callbacks are async-signal-safe. */
struct counter {
  struct uprobe_consumer uc;
  atomic_long hits, arg_sum, filtered_out;
  atomic_ulong last_ip;
  long set_rdi;        /* nonzero: write it into rdi */
  int remove_after;    /* nonzero: return UPROBE_HANDLER_REMOVE from this hit on */
  pid_t only_tid;      /* nonzero: filter to this thread */
  atomic_int nested_rc, nested_in_handler, bad_cookie;
  bool try_nested;     /* call uprobe_register_addr from the handler */
};

static int count_hit(struct uprobe_consumer *self, struct uprobe_regs *regs, uint64_t *cookie) {
  struct counter *c = self->user_data;
  long n = atomic_fetch_add(&c->hits, 1) + 1;
  atomic_fetch_add(&c->arg_sum, (long)regs->rdi);
  atomic_store(&c->last_ip, regs->rip);
  if (*cookie != 0) atomic_store(&c->bad_cookie, 1); /* the cookie starts at 0 on every hit */
  *cookie = 42;
  if (c->set_rdi) regs->rdi = (uint64_t)c->set_rdi;
  if (c->try_nested) {
    struct uprobe_probe *p = NULL;
    atomic_store(&c->nested_in_handler, uprobe_in_handler());
    atomic_store(&c->nested_rc, uprobe_register_addr(ADDR(pkg_fixture_add2), self, &p));
  }
  return c->remove_after && n >= c->remove_after ? UPROBE_HANDLER_REMOVE : 0;
}

static int ret_hit(struct uprobe_consumer *self, uint64_t func, struct uprobe_regs *regs, uint64_t *cookie) {
  (void)self, (void)func, (void)regs, (void)cookie;
  return 0;
}

static bool only_tid(struct uprobe_consumer *self, pid_t tid) {
  struct counter *c = self->user_data;
  if (c->only_tid && tid != c->only_tid) {
    atomic_fetch_add(&c->filtered_out, 1);
    return false;
  }
  return true;
}

static void counter_init(struct counter *c) {
  memset(c, 0, sizeof *c);
  c->uc.handler = count_hit;
  c->uc.filter = only_tid;
  c->uc.user_data = c;
}

static void test_hits_regs_and_unregister(void) {
  struct counter c;
  counter_init(&c);
  struct uprobe_probe *p = NULL;
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &c.uc, &p), 0);
  CHECK(p != NULL);
  long sum = 0;
  for (long i = 1; i <= 5; i++) sum += pkg_fixture_add1(i);
  CHECK(sum == 20);
  CHECK(c.hits == 5);
  CHECK(c.arg_sum == 15);
  CHECK(c.last_ip == (uintptr_t)ADDR(pkg_fixture_add1));
  c.set_rdi = 100; /* registers are writable */
  CHECK(pkg_fixture_add1(1) == 101);
  c.set_rdi = 0;
  CHECK(!uprobe_in_handler());
  CHECK_RC(uprobe_unregister(p, &c.uc), 0);
  CHECK(pkg_fixture_add1(1) == 2);
  CHECK(c.hits == 6);
  CHECK(c.bad_cookie == 0);
}

static void test_handler_remove(void) {
  struct counter c;
  counter_init(&c);
  c.remove_after = 2;
  struct uprobe_probe *p = NULL;
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &c.uc, &p), 0);
  for (int i = 0; i < 5; i++) pkg_fixture_add1(i);
  CHECK(c.hits == 2);
  CHECK_RC(uprobe_unregister(p, &c.uc), 0); /* the registration stays until unregistered */
  CHECK_RC(uprobe_unregister(p, &c.uc), -ENOENT);
}

static void *call_add1(void *arg) {
  for (int i = 0; i < 4; i++) pkg_fixture_add1(i);
  (void)arg;
  return NULL;
}

static void test_filter_and_shared_probe(void) {
  struct counter mine, all;
  counter_init(&mine);
  counter_init(&all);
  mine.only_tid = getpid(); /* the main thread */
  all.uc.filter = NULL;
  struct uprobe_probe *p1 = NULL, *p2 = NULL;
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &mine.uc, &p1), 0);
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &all.uc, &p2), 0);
  CHECK(p1 == p2); /* one probe, two consumers */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, call_add1, NULL) == 0);
  pthread_join(t, NULL);
  pkg_fixture_add1(0);
  pkg_fixture_add1(0);
  CHECK(mine.hits == 2);
  CHECK(mine.filtered_out == 4);
  CHECK(all.hits == 6);
  CHECK_RC(uprobe_unregister(p1, &mine.uc), 0);
  pkg_fixture_add1(0);
  CHECK(mine.hits == 2);
  CHECK(all.hits == 7);
  CHECK_RC(uprobe_unregister(p2, &all.uc), 0);
}

static void test_one_consumer_many_probes_and_path_offset(void) {
  struct counter c;
  counter_init(&c);
  char path[4096], exe[4096];
  uint64_t off1 = 0, off2 = 0;
  CHECK_RC(uprobe_resolve_address(ADDR(pkg_fixture_add1), path, sizeof path, &off1), 0);
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  CHECK(n > 0);
  exe[n > 0 ? n : 0] = '\0';
  CHECK(strcmp(path, exe) == 0);
  CHECK_RC(uprobe_resolve_address(ADDR(pkg_fixture_add2), NULL, 0, &off2), 0);
  CHECK(off2 > off1);
  char tiny[4];
  CHECK_RC(uprobe_resolve_address(ADDR(pkg_fixture_add1), tiny, sizeof tiny, NULL), -ERANGE);

  struct uprobe_probe *p1 = NULL, *p2 = NULL;
  CHECK_RC(uprobe_register(path, off1, &c.uc, &p1), 0);
  CHECK_RC(uprobe_register(path, off2, &c.uc, &p2), 0);
  CHECK(p1 != p2);
  pkg_fixture_add1(1);
  pkg_fixture_add2(10);
  pkg_fixture_add2(100);
  CHECK(c.hits == 3);
  CHECK(c.arg_sum == 111);
  CHECK_RC(uprobe_unregister(p1, &c.uc), 0);
  pkg_fixture_add1(1);
  pkg_fixture_add2(1000);
  CHECK(c.hits == 4);
  CHECK_RC(uprobe_unregister(p2, &c.uc), 0);
}

/* A UNIX socket cannot be opened (open(2) says ENXIO, which is libuprobe's
 * "not file-backed"): it is "not a regular file", -ENOEXEC. */
static void test_socket_path(struct counter *c) {
  char dir[] = "/tmp/libuprobe-c-api-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/sock", dir);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  CHECK(s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
  struct uprobe_probe *p = NULL;
  CHECK_RC(uprobe_register(sa.sun_path, 0, &c->uc, &p), -ENOEXEC);
  CHECK(strstr(uprobe_last_error(), "not a regular file (a socket)") != NULL);
  close(s);
  unlink(sa.sun_path);
  rmdir(dir);
}

/* An unreadable file gives -EACCES: checked in a child that drops to uid
 * 65534 (root opens any file), with a mode-000 copy of nothing. */
static void test_unreadable_file(struct counter *c) {
  char path[] = "/tmp/libuprobe-c-api-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(write(fd, "\x7f" "ELF", 4) == 4);
  close(fd);
  CHECK(chmod(path, 0) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    if (geteuid() == 0 && setresuid(65534, 65534, 65534) != 0) _exit(90);
    struct uprobe_probe *p = NULL;
    int rc = uprobe_register(path, 0, &c->uc, &p);
    if (rc != -EACCES) {
      fprintf(stderr, "unreadable file: %d (%s: %s), want %d\n", rc, uprobe_strerror(rc), uprobe_last_error(), -EACCES);
      _exit(91);
    }
    if (strstr(uprobe_last_error(), "Permission denied") == NULL) _exit(92);
    if (strcmp(uprobe_strerror(rc), "permission denied: the file cannot be opened for reading") != 0) _exit(93);
    _exit(0);
  }
  int status = -1;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  unlink(path);
}

static void test_errors(void) {
  struct counter c, other;
  counter_init(&c);
  counter_init(&other);
  struct uprobe_probe *p = NULL, *q = NULL;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';

  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), NULL, &p), -EINVAL);
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &c.uc, NULL), -EINVAL);
  CHECK_RC(uprobe_register(NULL, 0, &c.uc, &p), -EINVAL);
  c.uc.handler = NULL;
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &c.uc, &p), -EINVAL);
  c.uc.handler = count_hit;
  c.uc.ret_handler = ret_hit;
  CHECK_RC(uprobe_register_addr((const char *)ADDR(pkg_fixture_add1) + 3, &c.uc, &p), -EOPNOTSUPP);
  CHECK(strstr(uprobe_last_error(), "pkg_fixture_add1+0x3") != NULL);
  c.uc.ret_handler = NULL;

  CHECK_RC(uprobe_register("/nonexistent/libuprobe-test", 0, &c.uc, &p), -ENOENT);
  CHECK(strstr(uprobe_last_error(), "/nonexistent/libuprobe-test") != NULL);
  /* A path that cannot be opened says why (its open(2)/stat(2) errno). */
  CHECK_RC(uprobe_register("/proc/self/exe/x", 0, &c.uc, &p), -ENOTDIR);
  CHECK(strstr(uprobe_last_error(), "Not a directory") != NULL);
  CHECK(strcmp(uprobe_strerror(-ENOTDIR), "Not a directory") == 0);
  CHECK_RC(uprobe_register("/tmp", 0, &c.uc, &p), -EISDIR);
  CHECK(strstr(uprobe_last_error(), "/tmp") != NULL && strstr(uprobe_last_error(), "a directory") != NULL);
  CHECK(strcmp(uprobe_strerror(-EISDIR), "the path is a directory, not a regular file") == 0);
  CHECK_RC(uprobe_register("/dev/null", 0, &c.uc, &p), -ENOEXEC);
  CHECK(strstr(uprobe_last_error(), "not a regular file") != NULL);
  test_socket_path(&c);
  CHECK(strstr(uprobe_last_error(), "not a regular file") != NULL);
  test_unreadable_file(&c);
  CHECK_RC(uprobe_register(exe, 1ull << 40, &c.uc, &p), -EINVAL);
  CHECK(strstr(uprobe_last_error(), exe) != NULL && strstr(uprobe_last_error(), "0x10000000000") != NULL);
  CHECK_RC(uprobe_register_addr(rodata_fixture, &c.uc, &p), -ENOEXEC);
  CHECK_RC(uprobe_register_addr((const char *)ADDR(pkg_fixture_add1) + 1, &c.uc, &p), -EILSEQ);
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_int3), &c.uc, &p), -EOPNOTSUPP);
  void *anon = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(anon != MAP_FAILED);
  CHECK_RC(uprobe_register_addr(anon, &c.uc, &p), -ENXIO);
  munmap(anon, 4096);
  CHECK_RC(uprobe_register_addr(ADDR(uprobe_register), &c.uc, &p), -EPERM);
  CHECK_RC(uprobe_resolve_address(&c, NULL, 0, NULL), -ENXIO); /* the stack */

  /* Conflicts, and a refused request changes nothing. */
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &c.uc, &p), 0);
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add1), &c.uc, &q), -EEXIST);
  CHECK_RC(uprobe_unregister(p, &other.uc), -ENOENT); /* never registered anywhere */
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add2), &other.uc, &q), 0);
  CHECK_RC(uprobe_unregister(p, &other.uc), -ENOENT); /* registered, but on another probe */
  CHECK_RC(uprobe_unregister(NULL, &c.uc), -EINVAL);
  pkg_fixture_add1(1);
  CHECK(c.hits == 1);

  /* From inside a handler. */
  c.try_nested = true;
  pkg_fixture_add1(1);
  c.try_nested = false;
  CHECK(c.hits == 2);
  CHECK(c.nested_rc == -EDEADLK);
  CHECK(c.nested_in_handler == 1);
  CHECK_RC(uprobe_unregister(p, &c.uc), 0);
  CHECK_RC(uprobe_unregister(q, &other.uc), 0);

  CHECK(strcmp(uprobe_strerror(0), "success") == 0);
  CHECK(strcmp(uprobe_strerror(-EPERM), uprobe_strerror(EPERM)) == 0);
  CHECK(strcmp(uprobe_strerror(123456), "unknown libuprobe error") == 0);
  CHECK(strcmp(uprobe_version(), UPROBE_TEST_VERSION) == 0);
}

/* A USDT semaphore (ref_ctr): a 16-bit count in the file's data that every
 * registered consumer increments, here on pkg_fixture_add2's probe. */
UPROBE_USDT_DEFINE_SEMAPHORE(pkgtest, sema);

static void test_ref_ctr(void) {
  volatile unsigned short *sema = &UPROBE_USDT_SEMAPHORE(pkgtest, sema);
  struct counter a, b, c, rets[11];
  counter_init(&a);
  counter_init(&b);
  counter_init(&c);
  char exe[4096], path[4096], want[8192];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  uint64_t site = 0, sem = 0;
  CHECK_RC(uprobe_resolve_address(ADDR(pkg_fixture_add2), path, sizeof path, &site), 0);
  CHECK(strcmp(path, exe) == 0);
  CHECK_RC(uprobe_resolve_address((const void *)sema, path, sizeof path, &sem), 0);
  CHECK(strcmp(path, exe) == 0);
  struct uprobe_probe *p = NULL, *q = NULL, *r = NULL;

  CHECK(*sema == 0);
  CHECK_RC(uprobe_register_ref_ctr(NULL, site, sem, &a.uc, &p), -EINVAL);
  CHECK_RC(uprobe_register_ref_ctr(exe, site, sem, NULL, &p), -EINVAL);
  CHECK(*sema == 0);
  CHECK_RC(uprobe_register_ref_ctr(exe, site, sem, &a.uc, &p), 0);
  CHECK(*sema == 1);
  CHECK_RC(uprobe_register_ref_ctr(exe, site, sem, &b.uc, &q), 0);
  CHECK(q == p);
  CHECK(*sema == 2);
  /* Another semaphore, or none, on the same probe: -EBUSY, nothing changes. */
  CHECK_RC(uprobe_register_ref_ctr(exe, site, sem + 2, &c.uc, &r), -EBUSY);
  snprintf(want, sizeof want,
           "libuprobe: cannot probe %s at offset 0x%llx: the probe's USDT semaphore (ref_ctr_offset) is 0x%llx, "
           "not 0x%llx",
           exe, (unsigned long long)site, (unsigned long long)sem, (unsigned long long)(sem + 2));
  CHECK(strcmp(uprobe_last_error(), want) == 0);
  CHECK_RC(uprobe_register(exe, site, &c.uc, &r), -EBUSY);
  snprintf(want, sizeof want,
           "libuprobe: cannot probe %s at offset 0x%llx: the probe's USDT semaphore (ref_ctr_offset) is 0x%llx, "
           "not 0x0",
           exe, (unsigned long long)site, (unsigned long long)sem);
  CHECK(strcmp(uprobe_last_error(), want) == 0);
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add2), &c.uc, &r), -EBUSY);
  CHECK(strcmp(uprobe_strerror(-EBUSY), "the probe is registered with another USDT semaphore (ref_ctr_offset)") == 0);
  CHECK(strcmp(uprobe_strerror(-EBUSY), uprobe_strerror(-EEXIST)) != 0);
  CHECK(strcmp(uprobe_strerror(-EEXIST), "consumer already registered on this probe") == 0);
  CHECK(*sema == 2);
  /* The same consumer again: still -EEXIST, checked first. */
  CHECK_RC(uprobe_register_ref_ctr(exe, site, sem, &a.uc, &r), -EEXIST);
  CHECK(*sema == 2);
  CHECK(pkg_fixture_add2(1) == 3);
  CHECK(a.hits == 1 && b.hits == 1 && c.hits == 0);
  CHECK_RC(uprobe_unregister(q, &b.uc), 0);
  CHECK(*sema == 1);
  CHECK_RC(uprobe_unregister(p, &a.uc), 0);
  CHECK(*sema == 0);
  /* Once the probe is gone, another semaphore starts a new one. */
  CHECK_RC(uprobe_register_ref_ctr(exe, site, sem + 2, &c.uc, &r), 0);
  CHECK(*sema == 0);
  CHECK_RC(uprobe_unregister(r, &c.uc), 0);

  /* An 11th consumer with a ret_handler on one probe: -EUSERS. */
  struct uprobe_probe *rp[11];
  for (int i = 0; i < 11; i++) {
    counter_init(&rets[i]);
    rets[i].uc.handler = NULL;
    rets[i].uc.ret_handler = ret_hit;
  }
  for (int i = 0; i < 10; i++) CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add2), &rets[i].uc, &rp[i]), 0);
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add2), &rets[10].uc, &rp[10]), -EUSERS);
  CHECK(strstr(uprobe_last_error(), "this probe already has 10 consumers with a ret_handler") != NULL);
  CHECK(strcmp(uprobe_strerror(-EUSERS), "the probe has the most consumers with a ret_handler already (10)") == 0);
  for (int i = 0; i < 10; i++) CHECK_RC(uprobe_unregister(rp[i], &rets[i].uc), 0);
  CHECK(pkg_fixture_add2(2) == 4);
}

/* The same consumer registered and unregistered from two threads at once
 * (the adapter the C layer keeps per consumer), while a third thread calls. */
static struct counter g_shared;
static atomic_int g_stop, g_errors;

static void *churn(void *arg) {
  const void *site = arg;
  for (int i = 0; i < 30; i++) {
    struct uprobe_probe *p = NULL;
    if (uprobe_register_addr(site, &g_shared.uc, &p) != 0 || uprobe_unregister(p, &g_shared.uc) != 0)
      atomic_fetch_add(&g_errors, 1);
  }
  return NULL;
}

static void *caller(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    pkg_fixture_add1(1);
    pkg_fixture_add2(1);
  }
  return NULL;
}

static void test_concurrent_registration(void) {
  counter_init(&g_shared);
  g_shared.uc.filter = NULL;
  pthread_t a, b, c;
  CHECK(pthread_create(&c, NULL, caller, NULL) == 0);
  CHECK(pthread_create(&a, NULL, churn, (void *)ADDR(pkg_fixture_add1)) == 0);
  CHECK(pthread_create(&b, NULL, churn, (void *)ADDR(pkg_fixture_add2)) == 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  atomic_store(&g_stop, 1);
  pthread_join(c, NULL);
  CHECK(g_errors == 0);
  long before = g_shared.hits;
  pkg_fixture_add1(1);
  pkg_fixture_add2(1);
  CHECK(g_shared.hits == before);
  /* Every registration gone: the C layer holds nothing for the consumer. */
  CHECK_RC(uprobe_unregister((struct uprobe_probe *)&g_shared, &g_shared.uc), -ENOENT);
}

/* Session consumer: the cookie written at entry comes back at return; the
 * return handler sees the returned value and can change it; IGNORE skips the
 * return call. */
struct session {
  struct uprobe_consumer uc;
  atomic_long entries, returns, bad;
};
static int session_entry(struct uprobe_consumer *self, struct uprobe_regs *regs, uint64_t *cookie) {
  struct session *s = self->user_data;
  atomic_fetch_add(&s->entries, 1);
  *cookie = regs->rdi * 7;
  return regs->rdi == 13 ? UPROBE_HANDLER_IGNORE : 0;
}
static int session_return(struct uprobe_consumer *self, uint64_t func, struct uprobe_regs *regs, uint64_t *cookie) {
  struct session *s = self->user_data;
  atomic_fetch_add(&s->returns, 1);
  if (func != (uint64_t)(uintptr_t)ADDR(pkg_fixture_add2) || *cookie != (regs->rax - 2) * 7) atomic_fetch_add(&s->bad, 1);
  regs->rax += 1000;
  return 0;
}
static void test_session(void) {
  struct session s;
  memset(&s, 0, sizeof s);
  s.uc.handler = session_entry;
  s.uc.ret_handler = session_return;
  s.uc.user_data = &s;
  struct uprobe_probe *p = NULL;
  CHECK_RC(uprobe_register_addr(ADDR(pkg_fixture_add2), &s.uc, &p), 0);
  long sum = 0;
  for (long i = 0; i < 100; i++) sum += pkg_fixture_add2(i);
  /* every call returns i + 2 + 1000, except i == 13 (IGNORE: i + 2) */
  CHECK(sum == 4950 + 200 + 99 * 1000);
  CHECK(s.entries == 100);
  CHECK(s.returns == 99);
  CHECK(s.bad == 0);
  CHECK_RC(uprobe_unregister(p, &s.uc), 0);
  CHECK(pkg_fixture_add2(1) == 3);
}

/* The batch calls: per-request results, a bad request among good ones, two
 * consumers sharing a new probe, one grace period for the unregistering. */
static void test_batch(void) {
  struct counter a, b;
  counter_init(&a);
  counter_init(&b);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  uint64_t off2 = 0;
  CHECK_RC(uprobe_resolve_address(ADDR(pkg_fixture_add2), NULL, 0, &off2), 0);
  struct uprobe_consumer empty = {0};
  struct uprobe_request reqs[6] = {
      {.addr = ADDR(pkg_fixture_add1), .uc = &a.uc},
      {.path = exe, .offset = off2, .uc = &a.uc},
      {.path = "/nonexistent/libuprobe-batch", .offset = 0, .uc = &b.uc},
      {.addr = ADDR(pkg_fixture_add2), .uc = &b.uc},
      {.addr = ADDR(pkg_fixture_add1), .uc = &a.uc}, /* a.uc twice on one probe */
      {.addr = ADDR(pkg_fixture_add1), .uc = &empty},
  };
  CHECK_RC(uprobe_register_batch(reqs, 6), 3);
  CHECK(strstr(uprobe_last_error(), "/nonexistent/libuprobe-batch") != NULL); /* the first failure */
  CHECK(reqs[0].err == 0 && reqs[0].probe != NULL);
  CHECK(reqs[1].err == 0 && reqs[1].probe != NULL);
  CHECK(reqs[2].err == -ENOENT && reqs[2].probe == NULL);
  CHECK(reqs[3].err == 0 && reqs[3].probe == reqs[1].probe);
  CHECK(reqs[4].err == -EEXIST && reqs[4].probe == NULL);
  CHECK(reqs[5].err == -EINVAL && reqs[5].probe == NULL);
  CHECK(pkg_fixture_add1(5) == 6);
  CHECK(pkg_fixture_add2(7) == 9);
  CHECK(pkg_fixture_add2(8) == 10);
  CHECK(a.hits == 3 && a.arg_sum == 20);
  CHECK(b.hits == 2 && b.arg_sum == 15);

  struct uprobe_request un[4] = {
      {.probe = reqs[0].probe, .uc = &a.uc},
      {.probe = reqs[1].probe, .uc = &a.uc},
      {.probe = reqs[3].probe, .uc = &b.uc},
      {.probe = reqs[0].probe, .uc = &b.uc}, /* b was never on add1's probe */
  };
  CHECK_RC(uprobe_unregister_batch(un, 4), 1);
  CHECK(un[0].err == 0 && un[1].err == 0 && un[2].err == 0);
  CHECK(un[3].err == -ENOENT);
  CHECK(pkg_fixture_add1(5) == 6);
  CHECK(pkg_fixture_add2(7) == 9);
  CHECK(a.hits == 3 && b.hits == 2);
  CHECK(*(const unsigned char *)ADDR(pkg_fixture_add1) == 0x48); /* movq %rdi, %rax restored */
  CHECK_RC(uprobe_register_batch(NULL, 1), -EINVAL);
  CHECK_RC(uprobe_register_batch(NULL, 0), 0);
  CHECK_RC(uprobe_unregister_batch(un, 0), 0);
}

int main(void) {
  test_batch();
  test_session();
  test_hits_regs_and_unregister();
  test_handler_remove();
  test_filter_and_shared_probe();
  test_one_consumer_many_probes_and_path_offset();
  test_errors();
  test_ref_ctr();
  test_concurrent_registration();
  if (failures) {
    fprintf(stderr, "pkg.c_api: %d check(s) failed\n", failures);
    return 1;
  }
  printf("pkg.c_api: all checks passed\n");
  return 0;
}
