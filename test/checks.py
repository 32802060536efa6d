"""The plain-script Python tests' checks (no pytest): one line per check, `N passed, M failed` at the end,
which scripts/run_tests.sh sums over the suites."""

PASSED = 0
FAILED = 0


def check(name, cond, detail=""):
    global PASSED, FAILED
    if cond:
        PASSED += 1
        print(f"PASS {name}")
    else:
        FAILED += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))


def summary():
    """Prints the count line; the exit status: 1 if any check failed."""
    print(f"{PASSED} passed, {FAILED} failed")
    return 1 if FAILED else 0
