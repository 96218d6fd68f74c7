# tests/trace: a deterministic Python workload. fib(N) makes 2*fib(N+1)-1
# Python calls; each of the T generator throws enters the eval loop with
# throwflag set (python 3.11 fires function__entry there even when only that
# probe is enabled).
import sys


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def gen():
    while True:
        try:
            yield 1
        except ValueError:
            pass


n = int(sys.argv[1])
t = int(sys.argv[2]) if len(sys.argv) > 2 else 0
fib(n)
g = gen()
next(g)
for _ in range(t):
    g.throw(ValueError)
