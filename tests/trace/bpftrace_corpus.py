#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Runs the one-liners of bpftrace_corpus.txt with bpftrace (as root: the
expected outputs, bpftrace_expected/NAME.out) or with uprobe-trace (--check:
compares with the expected outputs).

  bpftrace_corpus.py FIXTURE USDT_FIXTURE          write bpftrace_expected/*.out with bpftrace
  bpftrace_corpus.py FIXTURE USDT_FIXTURE --check UPROBE_TRACE
  bpftrace_corpus.py FIXTURE USDT_FIXTURE --only NAME[,NAME...]   only those entries (with bpftrace)

FIXTURE is the built trace_bt_fixture, USDT_FIXTURE trace_fixture (its USDT probes).
Run it while no test runs: bpftrace's kernel uprobes put int3s in every process running those files. find runs over the tree the test makes
(make_tree below, as bpftrace_test.cpp's)."""
import os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = ["a.h", "b.h", "c.c", "notes.txt", "sub/d.h", "sub/e.hpp", "sub/deep/f.h", "sub/deep/g.c"]


def entries():
    out, cur = [], {}
    for line in open(os.path.join(HERE, "bpftrace_corpus.txt")):
        line = line.rstrip("\n")
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                out.append(cur)
            cur = {}
            continue
        k, v = line.split(": ", 1)
        cur[k] = v
    if cur:
        out.append(cur)
    return out


def make_tree(root):
    for f in TREE:
        p = os.path.join(root, f)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        open(p, "w").close()


def main():
    fixture = os.path.realpath(sys.argv[1])
    usdt_fixture = os.path.realpath(sys.argv[2])
    check = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--check" else None
    only = set(sys.argv[4].split(",")) if len(sys.argv) > 4 and sys.argv[3] == "--only" else None
    tree = tempfile.mkdtemp(prefix="bt-tree.")
    make_tree(tree)
    bad = 0
    for e in entries():
        if only is not None and e["name"] not in only:
            continue
        prog = e["prog"].replace("@FIXTURE@", fixture).replace("@USDT_FIXTURE@", usdt_fixture)
        cmd = fixture if e["cmd"] == "fixture" else e["cmd"].replace("@TREE@", tree).replace("@USDT_FIXTURE@", usdt_fixture).replace("@FIXTURE@", fixture)
        opts = e.get("opts", "").split()
        tool = [check] if check else ["bpftrace"]
        r = subprocess.run(tool + opts + ["-e", prog, "-c", cmd], capture_output=True, text=True, cwd=tree)
        out = r.stdout.replace(usdt_fixture, "@USDT_FIXTURE@").replace(fixture, "@FIXTURE@")
        path = os.path.join(HERE, "bpftrace_expected", e["name"] + ".out")
        if check:
            want = open(path).read() if os.path.exists(path) else None
            if out != want:
                bad += 1
                print("DIFFERS:", e["name"], "\n--- got\n" + out + "--- want\n" + str(want) + "--- stderr\n" + r.stderr)
        else:
            if r.returncode != 0:
                print("bpftrace failed:", e["name"], r.stderr, file=sys.stderr)
            open(path, "w").write(out)
    print(("%d differ" % bad) if check else "written")
    return 1 if bad else 0


sys.exit(main())
