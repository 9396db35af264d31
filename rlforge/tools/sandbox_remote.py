"""``remote``: run the code on a SandboxFusion server (the HTTP form verl's ``sandbox_fusion`` tool uses).

The tool's ``config.sandbox_fusion_url`` is the full endpoint (SandboxFusion's is ``http://HOST:8080/run_code``).
Each run POSTs JSON ``{"code", "language": "python", "run_timeout", "compile_timeout", "memory_limit_MB",
"stdin": "", "files": {}, "fetch_files": []}`` and reads ``status`` (``Success`` / ``Failed`` /
``SandboxError``) and ``run_result.{status, stdout, stderr, return_code, execution_time}`` (``status``:
``Finished`` / ``TimeLimitExceeded`` / ``Error``).  The isolation is the server's; nothing runs here.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from rlforge.tools.base import ToolError
from rlforge.tools.sandbox_base import SANDBOXES, Limits, RunResult


class RemoteSandbox:
    """POSTs each program to ``url``; ``request_slack_s`` is added to the run timeout for the HTTP request."""

    name = "remote"

    def __init__(self, url: str, request_slack_s: float = 10.0) -> None:
        self.url, self.request_slack_s = url, request_slack_s

    def run(self, code: str, limits: Limits) -> RunResult:
        """Run ``code`` remotely.

        Raises:
            ToolError: the server cannot be reached, answers an HTTP error or not JSON, or reports
                ``SandboxError`` (the message names the URL; the model reads it as the tool's error).
        """
        body = json.dumps({"code": code, "language": "python", "run_timeout": limits.wall_s,
                           "compile_timeout": limits.wall_s, "memory_limit_MB": limits.memory_mb, "stdin": "",
                           "files": {}, "fetch_files": []}).encode()
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=limits.wall_s + self.request_slack_s) as resp:
                answer = json.loads(resp.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as e:
            raise ToolError(f"remote sandbox {self.url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ToolError(f"remote sandbox {self.url}: unreachable ({getattr(e, 'reason', e)})") from None
        except ValueError:
            raise ToolError(f"remote sandbox {self.url}: the answer is not JSON") from None
        return _result(answer, limits, time.perf_counter() - t0, self.url)


def _result(answer: Any, limits: Limits, wall_s: float, url: str) -> RunResult:
    """The :class:`RunResult` of a SandboxFusion ``answer``.

    Raises:
        ToolError: ``SandboxError``, or an answer not in SandboxFusion's shape (``run_result`` not an
            object, ``stdout``/``stderr`` not text, ``return_code`` not an integer); the message names the URL.
    """
    if not isinstance(answer, dict) or answer.get("status") == "SandboxError":
        msg = answer.get("message", "") if isinstance(answer, dict) else answer
        raise ToolError(f"remote sandbox {url}: sandbox error {str(msg)[:200]!r}")
    run = answer.get("run_result") or {}
    rc = run.get("return_code") if isinstance(run, dict) else None
    if (not isinstance(run, dict) or not all(isinstance(run.get(k) or "", str) for k in ("stdout", "stderr"))
            or not (rc is None or (isinstance(rc, int) and not isinstance(rc, bool)))):
        raise ToolError(f"remote sandbox {url}: the answer is not SandboxFusion's shape (run_result.stdout, "
                        f"stderr: text; return_code: integer): {json.dumps(answer)[:200]}")
    text = (run.get("stdout") or "") + (run.get("stderr") or "")
    data = text.encode("utf-8", errors="replace")
    killed = f"wall time limit of {limits.wall_s:g} s" if run.get("status") == "TimeLimitExceeded" else ""
    out = data[:limits.max_output_bytes].decode("utf-8", errors="replace")
    return RunResult(out, None if killed or rc is None else rc, killed, len(data) > limits.max_output_bytes,
                     wall_s)


@SANDBOXES.register("remote")
def make_remote(config: dict[str, Any]) -> RemoteSandbox:
    """A :class:`RemoteSandbox` at ``config["sandbox_fusion_url"]``.

    Raises:
        ValueError: the URL is missing or not ``http(s)://...``.
    """
    url = config.get("sandbox_fusion_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"sandbox_fusion_url={url!r}: the remote sandbox needs an http(s) URL, e.g. "
                         "http://HOST:8080/run_code")
    return RemoteSandbox(url)
