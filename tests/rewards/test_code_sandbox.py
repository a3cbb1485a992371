"""Code checker and sandbox: every known harness attack contained, no process left."""

from __future__ import annotations

import json
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import rlvr.rewards.fixtures as fixtures_pkg
from rlvr.rewards import REWARDS, check_code
from rlvr.rewards.codecheck import compile_assert_tests, extract_code
from rlvr.rewards.sandbox import Limits, literal_value, resolve_isolation, run_sandboxed

FIXTURES = Path(fixtures_pkg.__file__).parent / "code.jsonl"
CASES = [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]
# Short limits keep the suite fast; every attack is bounded by one of these, not by luck.
FAST = Limits(timeout_s=2.0, memory_mb=256, output_bytes=1 << 18)


def _live_children_of_sandboxes() -> set[int]:
    """Non-zombie processes whose uid is a sandbox uid (>= 100000) or that carry a sandbox marker."""
    live = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry.name}/status").read_text()
            environ = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].strip().startswith("Z"):
            continue
        if int(fields["Uid"].split()[0]) >= 100_000 or b"RLVR_SANDBOX=" in environ:
            live.add(int(entry.name))
    return live


@pytest.fixture(scope="module")
def suite_results():
    before = _live_children_of_sandboxes()
    with ThreadPoolExecutor(max_workers=8) as pool:
        verdicts = list(pool.map(lambda c: check_code(c["completion"], c["tests"], limits=FAST), CASES))
    return verdicts, before, _live_children_of_sandboxes()


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_fixture_case(suite_results, index):
    verdict, case = suite_results[0][index], CASES[index]
    assert verdict.correct is case["expected"], f"{case['name']}: {case['why']} -> {verdict.reason} {verdict.extra}"
    assert verdict.reward == float(case["expected"])


def test_no_process_left_behind(suite_results):
    _, before, after = suite_results
    assert after - before == set()


def test_suite_covers_the_issue_attacks():
    names = {c["name"] for c in CASES}
    for attack in [
        "sys_exit_at_import",
        "os_exit_at_import",
        "always_equal_object",
        "print_pass_marker",
        "read_harness_and_forge",
        "read_tests_from_disk",
        "fork_bomb",
        "memory_bomb",
        "disk_bomb",
        "stdout_bomb",
        "sleep_past_limit",
        "network_needed",
        "setsid_detach",
    ]:
        assert attack in names


def test_detached_sleeper_of_a_correct_program_is_killed():
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\ndef add(a, b):\n    return a + b\n"
    before = _live_children_of_sandboxes()
    v = check_code(code, ["assert add(1, 2) == 3"], limits=FAST)
    assert v.correct  # the answer is right; the sleeper is the sandbox's problem, and it is gone
    assert _live_children_of_sandboxes() - before == set()


@pytest.mark.skipif(resolve_isolation() != "namespaces", reason="network namespace isolation needs root here")
def test_cannot_reach_a_listening_socket_on_host_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        code = f"import socket\ndef probe():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n    return 'reached'\n"
        run = run_sandboxed(code, [{"kind": "eval", "code": "probe()"}], limits=FAST)
        assert ("ERROR", 0, "ConnectionRefusedError") in run.records or any(
            k == "ERROR" and i == 0 for k, i, _ in run.records
        )
        assert ("VALUE", 0, "'reached'") not in run.records
        # ... and the same probe from here reaches it, so the test can fail.
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        server.close()


def test_rlimits_fallback_kills_a_detached_child_by_its_marker():
    # Without namespaces nothing kills a setsid'd grandchild for us: the environment marker does.
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\ntime.sleep(0.2)\ndef add(a, b):\n    return a + b\n"
    before = _live_children_of_sandboxes()
    v = check_code(code, ["assert add(1, 2) == 3"], limits=FAST, isolation="rlimits")
    assert v.correct and v.extra["killed_after_exit"] >= 1
    assert _live_children_of_sandboxes() - before == set()


def test_rlimits_fallback_runs_and_says_so():
    v = check_code("def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3"], limits=FAST, isolation="rlimits")
    assert v.correct and v.extra["isolation"] == "rlimits"
    assert any("host filesystem" in note for note in v.extra["notes"])


@pytest.mark.parametrize("isolation", ["namespaces", "bwrap"])
def test_empty_root_hides_host_files_sockets_and_keeps_nothing(tmp_path, isolation):
    import shutil
    import tempfile

    from rlvr.rewards.sandbox import _works

    if (
        isolation == "namespaces"
        and os.geteuid() != 0
        or isolation == "bwrap"
        and shutil.which("bwrap") is None
        or not _works(isolation)
    ):
        pytest.skip(
            f"{isolation} isolation is not available here (root with CAP_SYS_ADMIN, or bubblewrap that can run)"
        )
    host_tmp = Path(tempfile.mkdtemp(prefix="rlvr-host-", dir="/tmp"))
    try:
        os.chmod(host_tmp, 0o777)
        secret = host_tmp / "cases.jsonl"
        secret.write_text('{"expected": 5}')
        os.chmod(secret, 0o644)
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(host_tmp / "host.sock"))
        os.chmod(host_tmp / "host.sock", 0o777)
        server.listen(1)
        probe = (
            "import os, socket\n"
            f"def secret():\n    return open({str(secret)!r}).read()\n"
            f"def sock():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({str(host_tmp / 'host.sock')!r})\n    return 1\n"
            "def project():\n    return os.path.exists(" + repr(str(Path(__file__).resolve())) + ")\n"
            f"def persist():\n    open({str(host_tmp / 'left.txt')!r}, 'w').write('x')\n    return 1\n"
            "def scratch():\n    import tempfile\n    with open(os.path.join(tempfile.gettempdir(), 'mine.txt'), 'w') as f:\n        f.write('ok')\n    return 1\n"
        )
        tests = [
            "assert secret() == 'x'",
            "assert sock() == 1",
            "assert project() is False",
            "assert persist() == 1",
            "assert scratch() == 1",
        ]
        v = check_code(probe, tests, limits=FAST, isolation=isolation)
        outcome = dict(v.extra["failures"])
        assert "OSError" in outcome[0] or "FileNotFoundError" in outcome[0], outcome  # the case file is not there
        assert 1 in outcome, outcome  # nor the host's socket
        assert 2 not in outcome  # the project's files do not exist for it
        assert 3 in outcome and not (host_tmp / "left.txt").exists()  # nothing written outside its private tmp
        assert 4 not in outcome  # its own tmp is writable
        server.close()
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)


def test_expected_values_never_enter_the_sandbox():
    tests = [
        "assert f(2) == 12345",
        "assert 777 == g()",
        "assert h(1) != 'secret'",
        "assert abs(area(2) - 12.566) < 1e-6",
        "assert f(1) == 4242 and f(2) == 4343",
        "assert 0 < f(3) < 9191 == 9191",
        "assert all(f(x) == y for x, y in [(1, 5151), (2, 5252)])",
        "for x, y in [(1, 6161), (2, 6262)]:\n    assert f(x) == y",
        "CASES = [(1, 7171)]\nfor a, b in CASES:\n    assert f(a) == b",
        "import math\nassert math.isclose(f(1), 8.125, rel_tol=1e-9)",
    ]
    compiled = compile_assert_tests(tests)
    sent = json.dumps([s for s in compiled.steps if s["kind"] == "eval"])
    for literal in (
        "12345",
        "777",
        "secret",
        "12.566",
        "4242",
        "4343",
        "9191",
        "5151",
        "5252",
        "6161",
        "6262",
        "7171",
        "8.125",
    ):
        assert literal not in sent, literal
    assert compiled.not_tamper_proof() == []
    # a comparison of two computed values, or an assert inside a helper, is judged in the sandbox: reported
    shaky = compile_assert_tests(
        [
            "assert f(3) == reference(3)",
            "def check():\n    assert f(1) == 2\ncheck()",
            "assert f(1) == 2",
            "import numpy as np\nassert np.allclose(f(1), [0.5])",
        ]
    )
    assert shaky.not_tamper_proof() == [0, 1, 3]
    # the test's own imports of pure functions are applied in the parent too
    aliased = compile_assert_tests(
        ["from math import isclose\nassert isclose(f(1), 0.3125)", "import math as m\nassert m.isclose(f(1), 0.3125)"]
    )
    assert "0.3125" not in json.dumps(aliased.steps) and aliased.not_tamper_proof() == []
    # a literal bound to a name stays in the parent unless a statement run in the sandbox needs it
    named = compile_assert_tests(
        [
            "expected = [4141] * 3\nassert f() == expected",
            "data = [3, 1, 2]\nsort_in_place(data)\nassert data == [1, 2, 3]",
        ]
    )
    sent = json.dumps(named.steps)
    assert "4141" not in sent and "data = [3, 1, 2]" in sent and named.not_tamper_proof() == []


@pytest.mark.parametrize(
    "program",
    [
        "class Z:\n    def __sub__(s, o): return 0\n    __rsub__ = __sub__\n    def __abs__(s): return 0\n    def __lt__(s, o): return True\n"
        "def area(r):\n    return Z()\n",
        "import builtins\nbuiltins.abs = lambda x: 0\ndef area(r):\n    return 0.0\n",
        "import math\nmath.isclose = lambda *a, **k: True\ndef area(r):\n    return 0.0\n",
        "class T(float):\n    def __sub__(s, o): return 0.0\n    __rsub__ = __sub__\ndef area(r):\n    return T(1.0)\n",
        "def area(r):\n    return 1.0\n",
    ],
)
def test_tolerance_asserts_are_judged_in_the_parent(program):
    tests = [
        "assert abs(area(2) - 12.566370614359172) < 1e-6",
        "import math\nassert math.isclose(area(2), 12.566370614359172)",
    ]
    v = check_code(program, tests, limits=FAST)
    assert not v.correct and v.extra["passed"] == 0, v.extra
    assert check_code("import math\ndef area(r):\n    return math.pi * r * r\n", tests, limits=FAST).correct


@pytest.mark.parametrize(
    "program, tests, expected",
    [
        ("def f(s):\n    return s\n", ["assert f('a\\nb\\\\n') == 'a\\nb\\\\n'", "assert f('\\\\n') == '\\\\n'"], True),
        ("def f(s):\n    return s.replace('\\n', '\\\\n')\n", ["assert f('a\\nb') == 'a\\nb'"], False),
        ("def f():\n    return 7 ** 6000\n", ["assert f() == 7 ** 6000"], True),
        ("def f():\n    return 7 ** 6000 + 1\n", ["assert f() == 7 ** 6000"], False),
        ("def f():\n    return list(range(300000))\n", ["assert f() == list(range(300000))"], True),
        (
            "from fractions import Fraction\ndef f():\n    return Fraction(1, 3)\n",
            ["from fractions import Fraction\nassert f() == Fraction(1, 3)"],
            True,
        ),
        (
            "from decimal import Decimal\ndef f():\n    return Decimal('1.5')\n",
            ["from decimal import Decimal\nassert f() == Decimal('1.5')"],
            True,
        ),
        (
            "from collections import Counter\ndef f():\n    return Counter('aab')\n",
            ["assert f() == {'a': 2, 'b': 1}"],
            True,
        ),
        (
            "from collections import defaultdict\ndef f():\n    d = defaultdict(int)\n    d['a'] += 1\n    return d\n",
            ["assert f() == {'a': 1}"],
            True,
        ),
        (
            "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n    return P(1, 2)\n",
            ["assert f() == (1, 2)"],
            True,
        ),
        (
            "def f():\n    return float('nan'), float('inf'), -0.0, b'\\x00', 1 + 2j\n",
            ["import math\nassert math.isnan(f()[0]) and f()[1:] == (float('inf'), 0.0, b'\\x00', 1 + 2j)"],
            True,
        ),
    ],
)
def test_plain_data_round_trip_is_exact(program, tests, expected):
    v = check_code(program, tests, limits=FAST)
    assert v.correct is expected, (v.reason, v.extra)


def test_dataset_conventions_solution_module_and_multiprocessing():
    program = "from multiprocessing import Pool\ndef sq(x):\n    return x * x\ndef f(xs):\n    with Pool(2) as p:\n        return p.map(sq, xs)\n"
    tests = ["from solution import f\nassert f([1, 2, 3]) == [1, 4, 9]", "import solution\nassert solution.sq(4) == 16"]
    v = check_code(program, tests, limits=Limits(timeout_s=10.0, memory_mb=512))
    assert v.correct, (v.reason, v.extra)


def test_literal_reader_handles_repr_forms_and_refuses_code():
    assert literal_value("[inf, -1, (1, 2), {'a': {1}}, set()]") == [float("inf"), -1, (1, 2), {"a": {1}}, set()]
    with pytest.raises(ValueError):
        literal_value("__import__('os').getcwd()")


def test_extract_code_takes_last_python_block():
    text = "Example:\n```python\nprint(1)\n```\nFinal:\n```python\ndef f():\n    return 2\n```"
    code, path, n = extract_code(text)
    assert (path, n) == ("fenced", 2) and "return 2" in code


def test_reward_function_contract_parallel():
    fn = REWARDS.get("code")(tests_column="tests", timeout_s=2.0)
    tests = [["assert add(1, 2) == 3"]] * 3
    completions = [
        "def add(a, b):\n    return a + b\n",
        [{"role": "assistant", "content": "def add(a, b):\n    return a - b\n"}],
        "def add(a, b):\n    return a + b\n",
    ]
    assert fn(None, completions, None, tests=tests, truncated=[False, False, True]) == [1.0, 0.0, 0.0]
    assert fn.kind == "correctness" and fn.gold_column == "tests" and fn.stats["truncated"] == 1


@pytest.mark.skipif(
    __import__("shutil").which("bwrap") is None, reason="bubblewrap not installed (apt-get install bubblewrap)"
)
@pytest.mark.parametrize(
    "name",
    [
        "correct_assert",
        "correct_stdio",
        "sys_exit_at_import",
        "always_equal_object",
        "write_result_channel",
        "stdout_bomb",
        "network_needed",
        "setsid_detach",
    ],
)
def test_bwrap_isolation(name):
    case = next(c for c in CASES if c["name"] == name)
    before = _live_children_of_sandboxes()
    v = check_code(case["completion"], case["tests"], limits=FAST, isolation="bwrap")
    assert v.extra["isolation"] == "bwrap"
    assert v.correct is case["expected"], (v.reason, v.extra)
    assert _live_children_of_sandboxes() - before == set()


def test_a_sandbox_that_cannot_be_built_raises_instead_of_scoring_zero():
    from rlvr.rewards.sandbox import SandboxSetupError

    # An open-files limit beyond what the kernel allows makes the harness's setup fail before any
    # model code runs; that must surface as an error, not as every completion being "wrong".
    with pytest.raises(SandboxSetupError, match="could not be set up"):
        run_sandboxed("pass", [], limits=Limits(nofile=2**40))


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="the uid drop applies when the parent is root")
def test_rlimits_fallback_as_root_cannot_signal_root_processes():
    # Without namespaces a program running as root could kill(-1, SIGKILL) every root process,
    # the trainer (and CI) included. The fallback drops to a uid of its own first.
    import subprocess
    import sys

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        code = "import os\nos.kill(-1, 9)\ndef add(a, b):\n    return a + b\n"
        v = check_code(code, ["assert add(1, 2) == 3"], limits=FAST, isolation="rlimits")
        assert v.extra["isolation"] == "rlimits"
        assert bystander.poll() is None, "the sandboxed program killed a root process outside the sandbox"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_busy_parent_thread_does_not_time_out_a_finished_program():
    # A thread holding the GIL past the deadline (a slow parse elsewhere in the batch) used to make
    # the pump wake after the deadline and score a program that had long finished as a timeout.
    import time

    from rlvr.rewards import sandbox

    real_select = sandbox.selectors.DefaultSelector

    class LateSelector(real_select):
        slept = False

        def select(self, timeout=None):
            # once the spec is written (stdin unregistered), stall past the deadline as if another
            # thread held the GIL; the program finishes meanwhile
            if not LateSelector.slept and len(self.get_map()) <= 4:
                LateSelector.slept = True
                time.sleep(2.5)
                return []  # woke up late with nothing read yet: the next look is past the deadline
            return super().select(timeout)

    sandbox.selectors.DefaultSelector = LateSelector
    try:
        run = run_sandboxed("def f():\n    return 1\n", [{"kind": "eval", "code": "f()"}], limits=Limits(timeout_s=2.0))
    finally:
        sandbox.selectors.DefaultSelector = real_select
    assert LateSelector.slept
    assert not run.timed_out and run.done and ("VALUE", 0, "1") in run.records, run
