"""Fork: what a child inherits is inert, exit does not wait
for it, a new Bus in the child works, the parent goes on delivering.

Each case runs a script in a fresh interpreter (the parent), which forks
(os.fork, multiprocessing with fork or spawn, a fork Pool) while its bus
delivers in the given mode.  The child checks that every method of the
inherited Bus, Subscription and Publisher raises the clear error, delivers
through a Bus of its own, and exits; the parent then delivers again.  The
test asserts on exit statuses and on the absence of any output on stderr
(a child waiting at exit for the parent's loops printed "upcall: at exit");
the deadline only catches a hang.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import DEADLINE, script_env

pytestmark = pytest.mark.threads

MODES = ["native", "python", "caller", "executor"]

SCRIPT = textwrap.dedent('''
    import multiprocessing
    import os
    import sys
    import threading

    import upcall
    from helpers import mode_kwargs

    PROBLEMS_EXIT = 3


    def deliver_once(bus, endpoint, mode, payload):
        """Subscribe on ``bus`` in ``mode``, send one message, wait for it.
        Returns (subscription, publisher, problems)."""
        got = []
        arrived = threading.Event()

        def target(msg):
            got.append(msg)
            arrived.set()

        sub = bus.subscribe(endpoint, target, kind="pull", bind=True, **mode_kwargs(mode))
        pub = bus.publisher(endpoint, kind="push", bind=False)
        return sub, pub, send_and_wait(sub, pub, got, arrived, mode, payload)


    def send_and_wait(sub, pub, got, arrived, mode, payload):
        pub.send(b"t", payload)
        if mode == "caller":
            sub.poll(timeout=20, max_messages=1)
        elif not arrived.wait(20):
            return [f"{payload!r} was not delivered"]
        arrived.clear()
        return [] if got and got[-1] == payload else [f"got {got!r}, not {payload!r}"]


    def inherited_objects_are_inert(parent_pid):
        """Every method of what the parent made raises the clear error."""
        calls = {
            "bus.subscribe": lambda: BUS.subscribe("inproc://x", print),
            "bus.publisher": lambda: BUS.publisher("inproc://y", bind=True),
            "bus.close": BUS.close,
            "with bus": lambda: BUS.__enter__(),
            "bus.max_sockets": lambda: BUS.max_sockets,
            "sub.close": SUB.close,
            "sub.stats": lambda: SUB.stats,
            "sub.poll/wait": (lambda: SUB.poll(timeout=0)) if MODE == "caller" else SUB.wait,
            "pub.send": lambda: PUB.send(b"t", 1),
            "pub.send_packed": lambda: PUB.send_packed(b"t", b"\\x01"),
            "pub.close": PUB.close,
        }
        problems = []
        for name, call in calls.items():
            try:
                call()
            except RuntimeError as exc:
                text = str(exc)
                if (f"created in process {parent_pid}" not in text
                        or "create a new Bus in the child" not in text):
                    problems.append(f"{name}: unclear error: {text}")
            else:
                problems.append(f"{name}: no error")
        if not (BUS.closed and SUB.closed and PUB.closed):
            problems.append("inherited objects do not say they are closed")
        if "inherited from process" not in repr(BUS):
            problems.append(f"repr: {BUS!r}")
        return problems


    def fresh_bus_delivers(mode):
        with upcall.Bus() as bus:
            sub, pub, problems = deliver_once(bus, "inproc://child", mode, "hello child")
        return problems


    def child_checks(parent_pid):
        return inherited_objects_are_inert(parent_pid) + fresh_bus_delivers(MODE)


    def child_main(parent_pid):
        """A forked child: checks, then exits as a program does (exit hooks run)."""
        problems = child_checks(parent_pid)
        if problems:
            print("child problems:", problems, flush=True)
            sys.exit(PROBLEMS_EXIT)


    def spawned_main(mode):
        problems = fresh_bus_delivers(mode)
        if problems:
            print("spawned child problems:", problems, flush=True)
            sys.exit(PROBLEMS_EXIT)


    def pool_task(parent_pid):
        return child_checks(parent_pid)


    if __name__ == "__main__":
        MODE, HOW = sys.argv[1], sys.argv[2]
        BUS = upcall.Bus()
        got, arrived = [], threading.Event()

        def on_msg(msg):
            got.append(msg)
            arrived.set()

        SUB = BUS.subscribe("inproc://parent", on_msg, kind="pull", bind=True,
                            **mode_kwargs(MODE))
        PUB = BUS.publisher("inproc://parent", kind="push", bind=False)
        problems = send_and_wait(SUB, PUB, got, arrived, MODE, "before")
        parent = os.getpid()
        if HOW == "os.fork":
            pid = os.fork()
            if pid == 0:
                child_main(parent)
                sys.exit(0)
            status = os.waitpid(pid, 0)[1]
            if os.waitstatus_to_exitcode(status) != 0:
                problems.append(f"child exit status {os.waitstatus_to_exitcode(status)}")
        elif HOW in ("fork", "spawn"):
            ctx = multiprocessing.get_context(HOW)
            if HOW == "fork":
                proc = ctx.Process(target=child_main, args=(parent,))
            else:
                proc = ctx.Process(target=spawned_main, args=(MODE,))
            proc.start()
            proc.join(60)
            if proc.exitcode != 0:
                problems.append(f"child exit code {proc.exitcode}")
        elif HOW == "pool":
            with multiprocessing.get_context("fork").Pool(2) as pool:
                for result in pool.map(pool_task, [parent] * 4):
                    problems += result
                pool.close()
                pool.join()
        problems += send_and_wait(SUB, PUB, got, arrived, MODE, "after")
        if problems:
            sys.exit(f"parent problems: {problems}")
        print("parent still delivers", flush=True)
''')


@pytest.fixture(scope="module")
def script_path(tmp_path_factory):
    # A file, not -c: a spawned child imports the script as its main module.
    path = tmp_path_factory.mktemp("fork") / "fork_script.py"
    path.write_text(SCRIPT)
    return str(path)


@pytest.mark.parametrize("how", ["os.fork", "fork", "spawn", "pool"])
@pytest.mark.parametrize("mode", MODES)
def test_forked_children_leave_inherited_objects_alone(script_path, mode, how):
    env = script_env()
    env.pop("PYTHONWARNINGS", None)
    # CPython 3.12+ warns (DeprecationWarning) when a multi-threaded process
    # calls os.fork from __main__: not upcall's output.
    cmd = [sys.executable, "-W", "ignore::DeprecationWarning", script_path, mode, how]
    try:
        proc = subprocess.run(cmd, env=env, cwd=os.path.dirname(script_path),
                              capture_output=True, text=True, timeout=4 * DEADLINE)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: stdout={e.stdout!r} stderr={e.stderr!r}")
    report = f"status {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert "parent still delivers" in proc.stdout, report
    assert proc.stderr == "", report
