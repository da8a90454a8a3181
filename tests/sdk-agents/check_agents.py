#!/usr/bin/env python3
"""Hand-check of the SDK test agents: drives each agent over raw JSON-RPC lines
on stdin/stdout and asserts what they send back. Stdlib only.

Usage: python3 tests/sdk-agents/check_agents.py [-v] [node|python ...]
  (run tests/sdk-agents/install.sh first; -v prints every wire line)
Ends with 'N passed, N failed'.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENTS = {
    "node": ["node", str(HERE / "node-agent.mjs")],
    "python": [str(HERE / ".venv" / "bin" / "python"), str(HERE / "python_agent.py")],
}
VERBOSE = False


class Agent:
    def __init__(self, name: str) -> None:
        self.name = name
        # cwd "/" on purpose: the agents must not depend on the cwd.
        self.proc = subprocess.Popen(
            AGENTS[name], cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.transcript: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.stderr = b""
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        self.lines.put(None)

    def _read_err(self) -> None:
        self.stderr = self.proc.stderr.read()

    def send_raw(self, line: str) -> None:
        self.transcript.append("-> " + line)
        if VERBOSE:
            print(f"  [{self.name}] -> {line}")
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def send(self, msg: dict) -> None:
        self.send_raw(json.dumps({"jsonrpc": "2.0", **msg}, separators=(",", ":")))

    def recv(self, timeout: float = 5.0) -> dict | None:
        """Next stdout line as JSON; None on timeout. Fails on EOF or non-JSON."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            raise AssertionError("agent closed stdout")
        self.transcript.append("<- " + line)
        if VERBOSE:
            print(f"  [{self.name}] <- {line}")
        msg = json.loads(line)  # non-JSON on stdout is a failure
        assert msg.get("jsonrpc") == "2.0", line
        return msg

    def expect(self, timeout: float = 5.0) -> dict:
        msg = self.recv(timeout)
        assert msg is not None, "timed out waiting for a message"
        return msg

    def expect_silence(self, timeout: float = 0.5) -> None:
        msg = self.recv(timeout)
        assert msg is None, f"unexpected message {msg}"

    def request(self, id_, method: str, params: dict) -> None:
        self.send({"id": id_, "method": method, "params": params})

    def init_session(self, cwd: str) -> str:
        self.request(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        r = self.expect()
        assert r["id"] == 0 and r["result"]["protocolVersion"] == 1, r
        self.request(1, "session/new", {"cwd": cwd, "mcpServers": []})
        r = self.expect()
        assert r["id"] == 1 and isinstance(r["result"]["sessionId"], str), r
        return r["result"]["sessionId"]

    def close(self, timeout: float = 5.0) -> int | None:
        """Close stdin (EOF) and return the exit code, or None if still running."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def prompt(a: Agent, id_, sid: str, text: str) -> None:
    a.request(id_, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]})


def update_of(msg: dict, sid: str) -> dict:
    assert msg.get("method") == "session/update" and "id" not in msg, msg
    assert msg["params"]["sessionId"] == sid, msg
    return msg["params"]["update"]


def expect_result(a: Agent, id_) -> dict:
    r = a.expect()
    assert r.get("id") == id_ and type(r["id"]) is type(id_) and "result" in r, r
    return r["result"]


def tool_turn(a: Agent, sid: str, cwd: str, id_, answer: dict | None, cancel_first: bool = False):
    """Runs a `tool` prompt; answers the permission request with `answer`.
    Returns (permission request id, final tool_call_update status, stopReason)."""
    prompt(a, id_, sid, "tool write the file")
    u = update_of(a.expect(), sid)
    assert u["sessionUpdate"] == "tool_call" and u["toolCallId"] == "call_1", u
    assert u["title"] == "Write hello.txt" and u["kind"] == "edit" and u["status"] == "pending", u
    assert u["locations"] == [{"path": os.path.join(cwd, "hello.txt")}], u
    assert u["rawInput"] == {"path": os.path.join(cwd, "hello.txt"), "content": "hello"}, u
    req = a.expect()
    assert req.get("method") == "session/request_permission" and "id" in req, req
    assert req["params"]["sessionId"] == sid and req["params"]["toolCall"]["toolCallId"] == "call_1", req
    kinds = [(o["optionId"], o["kind"]) for o in req["params"]["options"]]
    assert kinds == [("allow-once", "allow_once"), ("allow-always", "allow_always"),
                     ("reject-once", "reject_once")], kinds
    if cancel_first:
        a.send({"method": "session/cancel", "params": {"sessionId": sid}})
        a.expect_silence(0.3)  # the agent waits for our answer to the permission request
    a.send({"id": req["id"], "result": {"outcome": answer}})
    u = update_of(a.expect(), sid)
    assert u["sessionUpdate"] == "tool_call_update" and u["toolCallId"] == "call_1", u
    result = expect_result(a, id_)
    return req["id"], u["status"], result["stopReason"]


def scenario_main(name: str) -> None:
    """One connection through every behaviour, in order."""
    cwd = tempfile.mkdtemp(prefix="acp-cwd-")
    a = Agent(name)
    try:
        sid = a.init_session(cwd)

        # default: echo in chunks
        prompt(a, 2, sid, "hello world")
        texts = []
        for _ in range(3):
            u = update_of(a.expect(), sid)
            assert u["sessionUpdate"] == "agent_message_chunk" and u["content"]["type"] == "text", u
            texts.append(u["content"]["text"])
        assert "".join(texts) == "You said: hello world", texts
        assert expect_result(a, 2) == {"stopReason": "end_turn"}

        # tool: each answer; string ids for our prompts, agent's ids are its own counter
        perm_ids = []
        for id_, answer, cancel_first, want in [
            ("p-allow-once", {"outcome": "selected", "optionId": "allow-once"}, False, ("completed", "end_turn")),
            ("p-allow-always", {"outcome": "selected", "optionId": "allow-always"}, False, ("completed", "end_turn")),
            ("p-reject", {"outcome": "selected", "optionId": "reject-once"}, False, ("failed", "end_turn")),
            ("p-cancelled", {"outcome": "cancelled"}, False, ("failed", "cancelled")),
            ("p-cancel-rule", {"outcome": "cancelled"}, True, ("failed", "cancelled")),
        ]:
            pid, status, stop = tool_turn(a, sid, cwd, id_, answer, cancel_first)
            perm_ids.append(pid)
            assert (status, stop) == want, (id_, status, stop)
        assert perm_ids == [0, 1, 2, 3, 4], perm_ids  # numbers, from 0, one counter per connection

        # hang: one chunk, then nothing until session/cancel
        prompt(a, 10, sid, "hang")
        u = update_of(a.expect(), sid)
        assert u["sessionUpdate"] == "agent_message_chunk", u
        a.expect_silence(1.0)
        a.send({"method": "session/cancel", "params": {"sessionId": sid}})
        assert expect_result(a, 10) == {"stopReason": "cancelled"}

        # cancel with no turn running: ignored
        a.send({"method": "session/cancel", "params": {"sessionId": sid}})
        a.expect_silence(0.3)

        # unknown request -> -32601; unknown notification -> nothing
        a.request(11, "foo/bar", {})
        r = a.expect()
        assert r["id"] == 11 and r["error"]["code"] == -32601, r
        a.send({"method": "foo/notify", "params": {}})
        a.expect_silence(0.3)

        # unknown session -> error
        prompt(a, 12, "sess_nope", "hi")
        r = a.expect()
        assert r["id"] == 12 and "error" in r, r

        # second prompt while a turn runs -> error (our agents' choice), first turn unaffected
        prompt(a, 13, sid, "hang")
        update_of(a.expect(), sid)
        prompt(a, 14, sid, "hello")
        r = a.expect()
        assert r["id"] == 14 and "error" in r, r
        a.send({"method": "session/cancel", "params": {"sessionId": sid}})
        assert expect_result(a, 13) == {"stopReason": "cancelled"}

        # two sessions, separate turns
        a.request(15, "session/new", {"cwd": cwd, "mcpServers": []})
        sid2 = expect_result(a, 15)["sessionId"]
        assert sid2 != sid
        prompt(a, 16, sid2, "second")
        for _ in range(3):
            update_of(a.expect(), sid2)
        assert expect_result(a, 16) == {"stopReason": "end_turn"}

        # EOF while a turn hangs: the agent exits
        prompt(a, 17, sid, "hang")
        update_of(a.expect(), sid)
        rc = a.close()
        assert rc == 0, f"exit code after EOF: {rc}"
    finally:
        if a.proc.poll() is None:
            a.close(1)
        if VERBOSE:
            print(f"  [{name}] stderr:\n" + a.stderr.decode(errors="replace"))


def scenario_probe(name: str) -> dict:
    """Edge cases whose answers differ between SDKs; returns what was observed."""
    seen: dict = {}
    cwd = tempfile.mkdtemp(prefix="acp-cwd-")

    # request before initialize
    a = Agent(name)
    a.request(0, "session/new", {"cwd": cwd, "mcpServers": []})
    seen["session/new before initialize"] = a.expect()
    a.close()

    a = Agent(name)
    sid = a.init_session(cwd)
    # non-JSON line on stdin
    a.send_raw("this is not json")
    seen["non-JSON line"] = a.recv(0.5) or "no answer"
    # session/new without mcpServers
    a.request(2, "session/new", {"cwd": cwd})
    seen["session/new without mcpServers"] = a.expect()
    # $/cancel_request for our own running prompt
    prompt(a, 3, sid, "hang")
    update_of(a.expect(), sid)
    a.send({"method": "$/cancel_request", "params": {"requestId": 3}})
    seen["$/cancel_request for a running prompt"] = a.recv(0.5) or "no answer"
    a.send({"method": "session/cancel", "params": {"sessionId": sid}})
    r = a.expect()
    seen["session/cancel after that"] = r
    # permission answered with a JSON-RPC error
    prompt(a, 4, sid, "tool")
    a.expect()
    req = a.expect()
    a.send({"id": req["id"], "error": {"code": -32603, "message": "client failure"}})
    seen["permission answered with error"] = a.expect()
    # permission answered with the id as a string instead of a number
    prompt(a, 5, sid, "tool")
    a.expect()
    req = a.expect()
    a.send({"id": str(req["id"]), "result": {"outcome": {"outcome": "cancelled"}}})
    seen["permission answered with id as string"] = a.recv(1.0) or "no answer (turn stays open)"
    a.close()
    seen["stderr (last 300 chars)"] = a.stderr.decode(errors="replace")[-300:]
    return seen


def main(argv: list[str]) -> int:
    global VERBOSE
    args = [x for x in argv if x != "-v"]
    VERBOSE = "-v" in argv
    names = args or list(AGENTS)
    passed = failed = 0
    for name in names:
        for label, fn in [("main", scenario_main), ("probe", scenario_probe)]:
            t = time.time()
            try:
                out = fn(name)
            except Exception as exc:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name} {label}: {type(exc).__name__}: {exc}")
                continue
            passed += 1
            print(f"ok   {name} {label} ({time.time() - t:.1f}s)")
            if out and VERBOSE:
                for k, v in out.items():
                    print(f"     {k}: {json.dumps(v) if not isinstance(v, str) else v}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
