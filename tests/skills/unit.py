"""The counters and last line every tests/skills script shares (`unit: N passed, N failed, N skipped`)."""
import sys

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: " + what)


def finish():
    """print the unit line and exit 1 on any failure"""
    print("unit: %d passed, %d failed, 0 skipped" % (passed, failed))
    sys.exit(1 if failed else 0)
