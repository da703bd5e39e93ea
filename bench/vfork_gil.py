"""`python bench/vfork_gil.py`: does a thread starting a process keep the others from running Python meanwhile?

The broker's housekeeping thread starts a big broker's compaction writer
(subprocess.Popen, which uses vfork: the starting thread waits until the new
process has exec'd). That only spares the loop if the starting thread lets go
of the GIL while it waits. Run it as

    strace -f -qq -o /dev/null --seccomp-bpf -e trace=execve \\
        -e inject=execve:delay_enter=50000 python3 bench/vfork_gil.py

so that every exec is held 50 ms (as a new process waiting for a core on a
busy machine would be): each start then takes over 50 ms in the starting
thread. If the main thread's longest gap stays near the interpreter's switch
interval (5 ms), the GIL was free meanwhile; if it is over 50 ms too, it was
held. Without strace it shows the same at the machine's own exec time.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time


def main() -> None:
    starts: list[float] = []
    done = threading.Event()

    def start_processes() -> None:
        while not done.is_set():
            started = time.perf_counter()
            process = subprocess.Popen(["/bin/true"], stdin=subprocess.DEVNULL, close_fds=True)
            starts.append(time.perf_counter() - started)
            process.wait()
            time.sleep(0.05)

    starter = threading.Thread(target=start_processes)
    starter.start()
    gaps = []
    end = time.perf_counter() + 2.0
    last = time.perf_counter()
    while last < end:
        time.sleep(0.0002)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    done.set()
    starter.join()
    gaps.sort()
    starts.sort()
    print(f"python {sys.version.split()[0]}: {len(starts)} process starts in another thread, "
          f"median {starts[len(starts) // 2] * 1e3:.1f} ms, longest {starts[-1] * 1e3:.1f} ms; "
          f"this thread's longest wait to run {gaps[-1] * 1e3:.1f} ms (10th longest {gaps[-10] * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
