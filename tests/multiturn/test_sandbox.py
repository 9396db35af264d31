"""The python_executor's sandbox against hostile code (issue 37's findings), the refusal without a sandbox,
the remote SandboxFusion form against a local HTTP server, and the unsandboxed path's limits.

Each hostile test states what the old audit-hook subprocess let through; here it must not."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
import warnings

import pytest

from rlforge.errors import ConfigError
from rlforge.tools import ToolError, parse_tool_schema
from rlforge.tools.python_executor import PythonExecutorTool
from rlforge.tools.sandbox import Limits, SandboxUnavailable, select_sandbox
from rlforge.tools.sandbox_unsafe import UnsandboxedSubprocess, unshare_works


def _local_sandbox():
    try:
        return select_sandbox({})
    except SandboxUnavailable as e:
        return str(e)


SB = _local_sandbox()
# skipped only where neither bubblewrap nor nsjail is installed: where one is installed but cannot start a
# sandbox, every test below fails with the reason (a venv under /tmp once made the probe fail, silently)
needs_sandbox = pytest.mark.skipif(isinstance(SB, str) and not (shutil.which("bwrap") or shutil.which("nsjail")),
                                   reason=f"no local sandbox here: {SB}")
FAST = Limits(wall_s=5)


def _schema():
    return parse_tool_schema({"type": "function", "function": {"name": "python", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}}}})


def _run(code: str, limits: Limits = FAST):
    assert not isinstance(SB, str), f"bubblewrap or nsjail is installed but cannot start a sandbox: {SB}"
    assert SB.name in ("bwrap", "nsjail")  # never hostile code outside a sandbox
    return SB.run(code, limits)


@pytest.mark.e2e
@needs_sandbox
def test_limits_cpu_wall_memory_output():
    assert _run("import os; print(os.getcwd(), os.environ['HOME'])").output == "/tmp /tmp\n"
    r = _run("while True: pass", Limits(cpu_s=1, wall_s=20))
    assert r.exit_code is None and "CPU" in r.killed and r.wall_s < 10
    r = _run("import time; time.sleep(60)", Limits(wall_s=1))
    assert r.exit_code is None and "wall" in r.killed and r.wall_s < 5
    r = _run("x = bytearray(20 << 30)")  # 20 GiB
    assert "MemoryError" in r.output and r.exit_code == 1
    r = _run("print('y' * 10_000_000)", Limits(max_output_bytes=1000))
    assert r.truncated and len(r.output) == 1000 and r.wall_s < 5


@pytest.mark.e2e
@needs_sandbox
def test_programs_started_past_python_are_still_inside():
    # the old audit hook let _posixsubprocess.fork_exec run `id` as uid 0, and a shell reach 127.0.0.1
    code = ("import os, subprocess  # subprocess starts programs with _posixsubprocess.fork_exec\n"
            "os.system('id -u; grep CapEff /proc/self/status')\n"
            "subprocess.run(['/bin/sh', '-c', 'echo shell-ran; touch /usr/owned 2>/dev/null || echo ro-usr'])\n")
    r = _run(code)
    uid = int(r.output.split()[0])
    assert uid != 0 and "CapEff:\t0000000000000000" in r.output, r.output
    assert "shell-ran" in r.output and "ro-usr" in r.output and not os.path.exists("/usr/owned")


def _alive_with(marker: str) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(p))
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.e2e
@needs_sandbox
def test_setsid_child_dies_at_the_wall_limit(tmp_path):
    # the old subprocess: a setsid child outlived the kill and wrote a file 25 s later
    marker = f"rlforge-marker-{uuid.uuid4().hex}"
    target = tmp_path / "late.txt"
    code = (f"import subprocess, time\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 1.5; echo late > {target}; "
            f"echo late > /tmp/late; exec sleep 30 # {marker}'], start_new_session=True)\ntime.sleep(60)\n")
    r = _run(code, Limits(wall_s=1))
    assert "wall" in r.killed
    time.sleep(0.3)
    assert _alive_with(marker) == []  # the whole tree is gone, not only the group
    time.sleep(1.8)
    assert not target.exists() and _alive_with(marker) == []


@pytest.mark.e2e
@needs_sandbox
def test_fork_bomb_is_bounded():
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(300):\n        if os.fork() == 0:\n"
            "            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError as e:\n"
            "    print(type(e).__name__)\nprint('forked', n)\n")
    r = _run(code, Limits(wall_s=5, max_processes=50))
    assert "BlockingIOError" in r.output and int(r.output.split("forked")[1]) < 50, r.output


@pytest.mark.e2e
@needs_sandbox
def test_no_writes_or_reads_of_the_host_files(tmp_path):
    host_file = tmp_path / "secret.txt"
    host_file.write_text("host-secret")
    code = (f"import os\nfor p in [{str(host_file)!r}, {str(tmp_path / 'new.txt')!r}, '/usr/new.txt', '/etc/new',"
            " '/x.txt']:\n    try:\n        open(p, 'w').write('pwned'); print('WROTE', p)\n"
            "    except OSError as e:\n        print(type(e).__name__)\n"
            f"print(os.path.exists({str(host_file)!r}), os.path.exists('/work'), os.path.exists('/root/.bashrc'))\n")
    r = _run(code)
    assert "WROTE" not in r.output and "False False False" in r.output, r.output
    assert host_file.read_text() == "host-secret" and not (tmp_path / "new.txt").exists()


@pytest.mark.e2e
@needs_sandbox
def test_trainer_environment_and_processes_out_of_reach(monkeypatch):
    secret = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLFORGE_TEST_API_TOKEN", secret)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        code = (f"import os, signal\nprint(os.environ)\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
                "        try: print(open(f'/proc/{p}/environ').read())\n        except OSError as e: print(e)\n"
                f"for pid in ({os.getpid()}, {os.getppid()}, {sleeper.pid}):\n"
                "    try: print(open(f'/proc/{pid}/environ').read())\n    except OSError as e: print('no', pid)\n"
                f"    try: os.kill(pid, signal.SIGKILL); print('KILLED', pid)\n    except OSError: pass\n")
        r = _run(code)
        assert secret not in r.output and "KILLED" not in r.output
        assert f"no {os.getpid()}" in r.output and f"no {sleeper.pid}" in r.output
        assert sleeper.poll() is None  # the sleeper lives
    finally:
        sleeper.kill()
        sleeper.wait()


def _listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    threading.Thread(target=_accept, args=(srv,), daemon=True).start()
    return srv


def _accept(srv: socket.socket) -> None:
    try:
        while True:
            srv.accept()
    except OSError:  # closed by the test
        pass


CONNECT = "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('conn' + 'ected')"


@pytest.mark.e2e
@needs_sandbox
def test_no_network():
    srv = _listener()
    port = srv.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the check can see a connection
        r = _run(CONNECT.format(port=port)
                 + f"\nimport os; os.system('bash -c \"exec 3<>/dev/tcp/127.0.0.1/{port} && echo bash-connected\"')")
        assert "connected" not in r.output and ("refused" in r.output.lower() or "unreachable" in r.output.lower()), r.output
    finally:
        srv.close()


@pytest.mark.e2e
@needs_sandbox
def test_tool_uses_the_sandbox_and_reports():
    tool = PythonExecutorTool({"wall_s": 5}, _schema())
    assert tool.sandbox.name in ("bwrap", "nsjail")
    resp, _, m = asyncio.run(tool.execute("i", {"code": "print(6 * 7); raise SystemExit(3)"}))
    assert resp.text == "42\n\nexit status 3" and m["exit_code"] == 3


@pytest.mark.e2e
@needs_sandbox
def test_code_with_a_lone_surrogate_or_non_ascii_runs():
    # json.loads turns the escape "\ud800" into a lone surrogate; writing the code must not raise
    tool = PythonExecutorTool({"wall_s": 5}, _schema())
    resp, _, _ = asyncio.run(tool.execute("i", {"code": "# \ud800\nprint('\u00e9t\u00e9', len('\ud800'))"}))
    assert resp.text == "\u00e9t\u00e9 1\n", resp.text


@pytest.mark.e2e
def test_refuses_without_a_sandbox(monkeypatch, tmp_path):
    monkeypatch.setattr("rlforge.tools.sandbox_local.which", lambda name: None)
    with pytest.raises(SandboxUnavailable) as e:
        PythonExecutorTool({}, _schema())
    msg = str(e.value)
    assert "apt-get install bubblewrap" in msg and "allow_unsandboxed: true" in msg and "sandbox_fusion_url" in msg
    cfg = tmp_path / "tools.yaml"
    cfg.write_text("tools:\n  - class_name: python_executor\n    config: {wall_s: 3}\n    tool_schema:\n"
                   "      type: function\n      function: {name: python, parameters: {type: object, properties:"
                   " {code: {type: string}}}}\n")
    from rlforge.tools import load_tools

    with pytest.raises(ConfigError, match=r"tools\[0\]\.config: .*apt-get install bubblewrap"):
        load_tools(str(cfg))
    with pytest.warns(UserWarning, match="UNSANDBOXED"):
        tool = PythonExecutorTool({"allow_unsandboxed": True}, _schema())
    assert tool.sandbox.name == "unsandboxed"
    with pytest.raises(ValueError, match="network_namespace: unknown key"):
        PythonExecutorTool({"network_namespace": True, "allow_unsandboxed": True}, _schema())


@pytest.mark.e2e
def test_unsandboxed_path_keeps_its_limits():
    r = UnsandboxedSubprocess().run("while True: pass", Limits(cpu_s=1, wall_s=20))
    assert r.exit_code is None and "CPU" in r.killed
    r = UnsandboxedSubprocess().run("x = bytearray(1 << 30)", Limits(memory_mb=256))
    assert "MemoryError" in r.output and r.exit_code == 1
    srv = _listener()
    code = CONNECT.format(port=srv.getsockname()[1])
    try:
        assert "connected" in UnsandboxedSubprocess(netns=False, audit_hook=False).run(code, FAST).output
        r = UnsandboxedSubprocess(netns=False).run(code, FAST)  # the audit hook alone
        assert "connected" not in r.output and "sandbox: socket" in r.output
        if unshare_works():  # the network namespace alone
            r = UnsandboxedSubprocess(netns=True, audit_hook=False).run(code, FAST)
            assert "connected" not in r.output
    finally:
        srv.close()


class _FakeFusion(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeFusion.seen.append((self.path, body))
        if body["code"] == "boom":
            self.send_response(500)
            self.end_headers()
            return
        run = ({"status": "TimeLimitExceeded", "stdout": "", "stderr": "", "return_code": None}
               if body["code"] == "loop" else
               {"status": "Finished", "stdout": "out:" + body["code"], "stderr": "err", "return_code": 0})
        data = json.dumps({"status": "Success", "message": "", "run_result": run}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_remote_sandbox_fusion_endpoint(monkeypatch):
    monkeypatch.setattr("rlforge.tools.sandbox_local.which", lambda name: None)  # remote wins without them too
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeFusion)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/run_code"
    try:
        tool = PythonExecutorTool({"sandbox_fusion_url": url, "wall_s": 7, "memory_mb": 300}, _schema())
        assert tool.sandbox.name == "remote"
        resp, _, m = asyncio.run(tool.execute("i", {"code": "print(1)"}))
        assert resp.text == "out:print(1)err" and m["exit_code"] == 0
        path, body = _FakeFusion.seen[-1]
        assert path == "/run_code" and body["language"] == "python" and body["run_timeout"] == 7
        assert body["memory_limit_MB"] == 300 and body["code"] == "print(1)"
        resp, _, m = asyncio.run(tool.execute("i", {"code": "loop"}))
        assert "killed: wall time limit of 7 s" in resp.text and m["exit_code"] is None
        with pytest.raises(ToolError, match="HTTP 500"):
            asyncio.run(tool.execute("i", {"code": "boom"}))
    finally:
        srv.shutdown()
        srv.server_close()
    with pytest.raises(ToolError, match="unreachable"):
        asyncio.run(tool.execute("i", {"code": "print(1)"}))
    with pytest.raises(ValueError, match="sandbox_fusion_url"):
        PythonExecutorTool({"sandbox": "remote"}, _schema())


@pytest.mark.e2e
def test_no_warning_when_sandboxed():
    if isinstance(SB, str):
        pytest.skip(f"no local sandbox here: {SB}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PythonExecutorTool({}, _schema())


@pytest.mark.e2e
def test_auto_falls_back_to_nsjail(monkeypatch, tmp_path):
    # a stand-in nsjail that runs the command after `--` (this checks the selection and the plumbing only;
    # nsjail's own isolation is not tested here)
    fake = tmp_path / "nsjail"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setattr("rlforge.tools.sandbox_local.which", lambda name: str(fake) if name == "nsjail" else None)
    sb = select_sandbox({})
    assert sb.name == "nsjail" and "--rlimit_nproc" in sb.argv(FAST) and "--bindmount_ro" in sb.argv(FAST)
    assert sb.run("print(6 * 7)", FAST).output == "42\n"
    fake.write_text("#!/bin/sh\necho 'nsjail: cannot clone' >&2\nexit 1\n")
    with pytest.raises(SandboxUnavailable, match="cannot clone"):
        select_sandbox({"sandbox": "nsjail"})


@pytest.mark.e2e
@needs_sandbox
def test_a_venv_under_tmp_is_visible_inside(tmp_path, monkeypatch):
    # .ci/run and many users put the venv in a temporary folder; the sandbox's private /tmp hid it
    import sys

    from rlforge.tools.sandbox_local import make_bwrap

    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    assert str(tmp_path).startswith("/tmp/"), tmp_path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python3"))
    monkeypatch.setattr(sys, "prefix", str(venv))
    sb = make_bwrap({})  # runs its probe through the venv's interpreter
    out = sb.run("import sys, os; print(sys.prefix, os.access('/tmp', os.W_OK))", FAST)
    assert out.output.split() == [str(venv), "True"], out


@pytest.mark.e2e
@needs_sandbox
def test_the_shipped_python_tool_config_runs_code_in_the_sandbox():
    from rlforge.tools import load_tools

    tool = load_tools("builtin:python")["python"]
    assert isinstance(tool, PythonExecutorTool)
    resp, _, _ = asyncio.run(tool.execute("i", {"code": "import os; print(sum(range(10)), os.getuid() != 0)"}))
    assert resp.text == "45 True\n", resp.text


class _JunkFusion(http.server.BaseHTTPRequestHandler):
    """Answers HTTP 200 with JSON that is not SandboxFusion's shape (the code picks which)."""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        run = {"rc": {"status": "Finished", "stdout": "x", "return_code": "abc"},
               "run": "oops", "stdout": {"status": "Finished", "stdout": 5, "return_code": 0},
               "bool": {"status": "Finished", "stdout": "x", "return_code": True}}[body["code"]]
        data = json.dumps({"status": "Success", "run_result": run}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("code", ["rc", "run", "stdout", "bool"])
def test_remote_answer_of_the_wrong_shape_is_a_tool_error_naming_the_url(code):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JunkFusion)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/run_code"
    try:
        tool = PythonExecutorTool({"sandbox_fusion_url": url}, _schema())
        with pytest.raises(ToolError, match=f"remote sandbox {url}: the answer is not SandboxFusion's shape"):
            asyncio.run(tool.execute("i", {"code": code}))
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("key,value", [("wall_s", float("inf")), ("wall_s", float("nan")), ("cpu_s", float("inf")),
                                       ("max_output_bytes", True), ("memory_mb", "1e999")])
def test_limits_must_be_finite_numbers(key, value):
    from rlforge.tools.python_executor import limits_from_config

    with pytest.raises(ValueError, match=f"{key}=.*must be a finite number > 0"):
        limits_from_config({key: value})


@pytest.mark.parametrize("name", ["bwrap", "nsjail"])
def test_asking_for_a_missing_sandbox_names_the_install_and_the_key(monkeypatch, name):
    monkeypatch.setattr("rlforge.tools.sandbox_local.which", lambda _: None)
    with pytest.raises(SandboxUnavailable) as e:
        select_sandbox({"sandbox": name})
    msg = str(e.value)
    assert f"sandbox: {name}" in msg and f"`{name}` is not installed" in msg and "allow_unsandboxed: true" in msg
    assert ("apt-get install bubblewrap" in msg) == (name == "bwrap")


@pytest.mark.parametrize("key,value", [("cpu_s", 1.7), ("memory_mb", 512.5), ("max_processes", 2.5)])
def test_a_fractional_whole_unit_limit_is_refused_not_truncated(key, value):
    from rlforge.tools.python_executor import limits_from_config

    with pytest.raises(ValueError, match=f"{key}=.*must be a whole number"):
        limits_from_config({key: value})
    assert limits_from_config({"cpu_s": 2.0}).cpu_s == 2  # a whole float is fine


@pytest.mark.parametrize("choice", ["bwrap", "nsjail"])
def test_a_fusion_url_beside_a_local_sandbox_is_refused(choice):
    with pytest.raises(ValueError, match="only used by the remote sandbox"):
        select_sandbox({"sandbox": choice, "sandbox_fusion_url": "http://127.0.0.1:9/run_code"})
