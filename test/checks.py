"""The plain-script Python tests' checks (no pytest): one line per check, `N passed, M failed` at the end,
which scripts/run_tests.sh sums over the suites."""
import traceback

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


def run_check(name, fn):
    """Run fn() (which returns (ok, detail) or a bool); exceptions fail."""
    try:
        res = fn()
    except Exception as e:
        traceback.print_exc()
        check(name, False, f"{type(e).__name__}: {e}")
        return
    ok, detail = res if isinstance(res, tuple) else (res, "")
    check(name, ok, detail)


def summary():
    """Prints the count line; the exit status: 1 if any check failed."""
    print(f"{PASSED} passed, {FAILED} failed")
    return 1 if FAILED else 0
