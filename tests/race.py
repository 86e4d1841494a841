"""A hostile tenant's race loops against two views of one directory (tests/hostile.rs).

Each mode runs two processes for SECONDS: one works through view A, the other swaps
names through view B. It prints one line of counts; the test decides what they mean.

  takeover A_DIR B_DIR VICTIM_DIR VICTIM_FILE
      A: mkdir/rmdir `x`, mknod/unlink `y`; B: exchange `x` with VICTIM_DIR and `y`
      with VICTIM_FILE, and back.  Prints "made N swapped M".
  open A_DIR B_DIR VICTIM_FILE SECRET
      A: open(`x`, O_CREAT|O_RDWR) and read; B: rename VICTIM_FILE to `x` and back.
      Prints "opened N leaked M" (M: opens that returned the secret).
"""

import ctypes
import os
import stat
import sys
import time

SECONDS = float(os.environ.get("RACE_SECONDS", "3"))
RENAME_EXCHANGE = 2
AT_FDCWD = -100
libc = ctypes.CDLL(None, use_errno=True)


def exchange(a, b):
    return libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0


def run_pair(left, right):
    pid = os.fork()
    if pid == 0:
        try:
            right()
        finally:
            os._exit(0)
    try:
        return left()
    finally:
        os.waitpid(pid, 0)


def until():
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        yield


def takeover(a_dir, b_dir, victim_dir, victim_file):
    def maker():
        made = 0
        for _ in until():
            for make, remove, name in (
                (lambda p: os.mkdir(p, 0o700), os.rmdir, "x"),
                (lambda p: os.mknod(p, stat.S_IFREG | 0o600), os.unlink, "y"),
            ):
                p = os.path.join(a_dir, name)
                try:
                    make(p)
                    made += 1
                except OSError:
                    pass
                try:
                    # Only what this loop made (a victim's entry may hold the name).
                    if os.lstat(p).st_uid == os.getuid():
                        remove(p)
                except OSError:
                    pass
        return made

    def swapper():
        swapped = 0
        for _ in until():
            for name, victim in (("x", victim_dir), ("y", victim_file)):
                p = os.path.join(b_dir, name)
                v = os.path.join(b_dir, victim)
                if exchange(p, v):
                    swapped += 1
                    exchange(p, v)
        print("swapped", swapped, flush=True)

    print("made", run_pair(maker, swapper), flush=True)


def open_existing(a_dir, b_dir, victim_file, secret):
    def opener():
        opened = leaked = 0
        p = os.path.join(a_dir, "x")
        for _ in until():
            try:
                fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
            except OSError:
                continue
            opened += 1
            try:
                if os.read(fd, 100) == secret.encode():
                    leaked += 1
            except OSError:
                pass
            os.close(fd)
        return opened, leaked

    def swapper():
        v = os.path.join(b_dir, victim_file)
        x = os.path.join(b_dir, "x")
        for _ in until():
            try:
                os.rename(v, x)
                os.rename(x, v)
            except OSError:
                pass

    opened, leaked = run_pair(opener, swapper)
    print("opened", opened, "leaked", leaked)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    {"takeover": takeover, "open": open_existing}[mode](*args)
