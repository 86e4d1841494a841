"""A pod's workload, run inside the pod's user namespace as the pod's user (tests/userns.rs):
the loops of tests/common/workload.rs, as a process of the pod rather than threads of
the test, because only a process can be in another user namespace.

  pod_workload.py write ROOT STOP
  pod_workload.py read FILE STOP

Until the file STOP exists: `write` works in ROOT: writes a file, fsyncs it, reads it
back through a new descriptor and compares checksums; appends to a file held open
throughout and reads the record back through the same descriptor; lists a directory of
known entries and stats one. `read` (a read-only or secret view) reads FILE whole
through a new descriptor and through one held open, and compares each with the first
read. Every failed call and every mismatch is recorded. At the end it prints one JSON
object: rounds, failures, the longest round in milliseconds, and the uid, gid and
groups it ran as and the owner, group and mode of its first file, as the pod sees them.
"""

import hashlib
import json
import os
import sys
import time

mode, root, stop = sys.argv[1], sys.argv[2], sys.argv[3]


def pattern(seed, size):
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < size:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:size])


if mode == "write":
    writes = os.path.join(root, "writes")
    os.makedirs(writes, exist_ok=True)
    listed = os.path.join(root, "listed")
    os.makedirs(listed, exist_ok=True)
    inodes = {}
    for i in range(20):
        p = os.path.join(listed, "e%d" % i)
        with open(p, "w") as f:
            f.write(str(i))
        inodes[p] = os.stat(p).st_ino
    held = os.open(os.path.join(root, "held.log"), os.O_CREAT | os.O_RDWR | os.O_APPEND, 0o644)
    first = os.path.join(writes, "w0")
else:
    held = os.open(root, os.O_RDONLY)
    expected = hashlib.sha256(os.pread(held, 1 << 20, 0)).digest()
    first = root
appended = 0

failures = []
rounds = 0
longest = 0.0


def write_round(i):
    path = os.path.join(writes, "w%d" % (i % 50))
    data = pattern(i, 64 * 1024)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        back = f.read()
    if hashlib.sha256(back).digest() != hashlib.sha256(data).digest():
        raise AssertionError("round %d: %s reads back differently" % (i, path))


def append_round(i):
    global appended
    rec = pattern(1_000_000 + i, 512)
    os.write(held, rec)
    os.fdatasync(held)
    appended += 1
    size = os.fstat(held).st_size
    if size != appended * 512:
        raise AssertionError("after %d appends the file has %d bytes" % (appended, size))
    if os.pread(held, 512, (appended - 1) * 512) != rec:
        raise AssertionError("append %d reads back differently" % i)


def list_round(i):
    names = os.listdir(listed)
    if len(names) != len(inodes):
        raise AssertionError("listing %d has %d entries" % (i, len(names)))
    path = sorted(inodes)[i % len(inodes)]
    if os.stat(path).st_ino != inodes[path]:
        raise AssertionError("%s changed inode number" % path)


def read_round(i):
    with open(root, "rb") as f:
        if hashlib.sha256(f.read()).digest() != expected:
            raise AssertionError("round %d: %s reads differently" % (i, root))
    if hashlib.sha256(os.pread(held, 1 << 20, 0)).digest() != expected:
        raise AssertionError("round %d: the held descriptor reads differently" % i)


steps = (write_round, append_round, list_round) if mode == "write" else (read_round,)
while not os.path.exists(stop):
    start = time.monotonic()
    for step in steps:
        try:
            step(rounds)
        except Exception as e:  # every failed call counts
            failures.append("%s %d: %r" % (step.__name__, rounds, e))
    longest = max(longest, time.monotonic() - start)
    rounds += 1

st = os.stat(first)
print(
    json.dumps(
        {
            "rounds": rounds,
            "failures": failures[:20],
            "failed": len(failures),
            "longest_ms": round(longest * 1000, 1),
            "id": [os.getuid(), os.getgid(), sorted(os.getgroups())],
            "file": [st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)],
        }
    )
)
