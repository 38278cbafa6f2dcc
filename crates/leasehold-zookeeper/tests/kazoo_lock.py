"""A kazoo Lock on one lock path, driven over stdin/stdout by tests/kazoo.rs.

    python3 kazoo_lock.py <connect string> <lock path> [<extra lock pattern>...]

The patterns are passed to the Lock as `extra_lock_patterns`. It says
`STARTED kazoo <version>` once connected, then answers one command a line:

- `try`: a non-blocking acquire; says ACQUIRED or BUSY.
- `wait <seconds>`: an acquire with that timeout; says ACQUIRED, BUSY
  (it returned False) or TIMEOUT (it raised LockTimeout, as kazoo 2.8.0
  does when the contender ahead is still there at the timeout).
- `acquire`: a blocking acquire on its own thread; says
  `WAITING <predecessor>` each time the lock finds a new contender ahead
  of its node, and ACQUIRED when it holds.
- `status`: says HOLDING or NOT_HOLDING.
- `release`: releases the lock (once an `acquire` has ended); says
  RELEASED.
- `quit` (or the end of stdin): stops the client and exits.
"""

import sys
import threading

import kazoo.version
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout
from kazoo.recipe.lock import Lock

OUT = threading.Lock()


def say(line):
    with OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class ReportingLock(Lock):
    """kazoo's Lock, telling which contender it waits behind.

    `_get_predecessor` is where kazoo 2.8.0's Lock picks the contender
    ahead of its own node from the children it counts (its own
    `__lock__` nodes and the extra patterns'); this only reports it.
    """

    reporting = False
    last_reported = None

    def _get_predecessor(self, node):
        predecessor = super()._get_predecessor(node)
        if (
            self.reporting
            and predecessor is not None
            and predecessor != self.last_reported
        ):
            self.last_reported = predecessor
            say("WAITING " + predecessor)
        return predecessor


def main():
    hosts, path, patterns = sys.argv[1], sys.argv[2], sys.argv[3:]
    client = KazooClient(hosts=hosts, timeout=20.0)
    client.start(timeout=20.0)
    lock = ReportingLock(client, path, "kazoo", extra_lock_patterns=patterns)
    say("STARTED kazoo " + kazoo.version.__version__)

    def take():
        try:
            lock.acquire()
            say("ACQUIRED")
        except Exception as e:  # reported, the test fails on it
            say("ERROR " + repr(e))
        finally:
            lock.reporting = False

    taker = None
    for line in sys.stdin:
        command = line.strip()
        if command == "try":
            say("ACQUIRED" if lock.acquire(blocking=False) else "BUSY")
        elif command.startswith("wait "):
            try:
                got = lock.acquire(timeout=float(command.split()[1]))
                say("ACQUIRED" if got else "BUSY")
            except LockTimeout:
                say("TIMEOUT")
        elif command == "acquire":
            lock.reporting = True
            lock.last_reported = None
            taker = threading.Thread(target=take, daemon=True)
            taker.start()
        elif command == "status":
            say("HOLDING" if lock.is_acquired else "NOT_HOLDING")
        elif command == "release":
            if taker is not None and taker.is_alive():
                say("ERROR release while still acquiring")
                continue
            lock.release()
            say("RELEASED")
        elif command == "quit":
            break
        else:
            say("ERROR unknown command " + repr(command))
    client.stop()
    client.close()


if __name__ == "__main__":
    main()
