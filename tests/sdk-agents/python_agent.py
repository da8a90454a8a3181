"""Test agent for acp-gateway integration tests, built on the official Python SDK
(PyPI ``agent-client-protocol``, pinned in requirements.txt).

Launch: tests/sdk-agents/.venv/bin/python tests/sdk-agents/python_agent.py
        (any cwd; run install.sh first)

Speaks ACP v1 (JSON-RPC 2.0, one message per line) on stdin/stdout; logs go to
stderr only. Behaviour of session/prompt depends on the first word of the
prompt's text (same as node-agent.mjs):
  tool  -> tool_call update, session/request_permission, then
           tool_call_update completed (allow) / failed (reject or cancelled),
           stopReason end_turn, or cancelled if the permission was cancelled
           or session/cancel arrived
  hang  -> one agent_message_chunk, then waits for session/cancel,
           stopReason cancelled
  probe <json> -> <json> is an array of steps the agent does itself:
           ["read", path], ["list", dir]; one agent_message_chunk per step,
           a JSON line {"step", "ok": true, "value"} or {"step", "ok": false,
           "code"} (EACCES, ENOENT, ...), as node-agent.mjs's probe
  cost <a[:CUR]> ... -> per figure a usage_update with the session's cost
           so far {amount: a, currency: CUR (default USD)}, used growing by
           100, size 200000, then an agent_message_chunk "cost <figure> ";
           stopReason end_turn (as node-agent.mjs's cost)
  other -> agent_message_chunk updates "You " + "said: " + "<text>",
           stopReason end_turn
session/cancel cancels any running turn of that session.
"""

from __future__ import annotations

import asyncio
import errno
import importlib.metadata
import json
import logging
import os
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    start_tool_call,
    update_agent_message_text,
    update_tool_call,
)
from acp.schema import (
    AgentCapabilities,
    Cost,
    Implementation,
    PermissionOption,
    PromptCapabilities,
    ToolCallLocation,
    ToolCallUpdate,
    UsageUpdate,
)

AGENT_NAME = "acp-gateway-sdk-python-agent"
log = logging.getLogger(AGENT_NAME)


@dataclass
class Turn:
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Session:
    cwd: str
    turn: Turn | None = None


def prompt_text(prompt: list[Any]) -> str:
    return "".join(block.text for block in prompt if getattr(block, "type", None) == "text")


class TestAgent:
    def __init__(self) -> None:
        self._conn: Any = None  # acp AgentSideConnection, the client side of the wire
        self._sessions: dict[str, Session] = {}

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        log.info("initialize, client protocolVersion %s", protocol_version)
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=False,
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=False),
            ),
            auth_methods=[],
            agent_info=Implementation(name=AGENT_NAME, version="0.1.0"),
        )

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess_{uuid.uuid4()}"
        self._sessions[session_id] = Session(cwd=cwd)
        log.info("session/new %s cwd %s", session_id, cwd)
        return NewSessionResponse(session_id=session_id)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        session = self._sessions.get(session_id)
        if session is None:
            raise RequestError(-32002, "Resource not found", {"sessionId": session_id})
        if session.turn is not None:
            raise RequestError(-32600, "Invalid request: a prompt turn is already running in this session",
                               {"sessionId": session_id})
        turn = Turn()
        session.turn = turn
        try:
            text = prompt_text(prompt)
            words = text.split()
            first_word = words[0] if words else ""
            log.info("session/prompt %s mode %r", session_id, first_word)
            if first_word == "tool":
                stop_reason = await self._tool_turn(session, session_id, turn)
            elif first_word == "hang":
                stop_reason = await self._hang_turn(session_id, turn)
            elif first_word == "cost":
                stop_reason = await self._cost_turn(session_id, words[1:], turn)
            elif first_word == "probe":
                stop_reason = await self._probe_turn(session_id, text.strip()[len("probe"):])
            else:
                stop_reason = await self._echo_turn(session_id, text, turn)
            log.info("turn done %s %s", session_id, stop_reason)
            return PromptResponse(stop_reason=stop_reason)
        finally:
            session.turn = None

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self._sessions.get(session_id)
        turn = session.turn if session else None
        log.info("session/cancel %s %s", session_id, "(turn running)" if turn else "(no turn)")
        if turn is not None:
            turn.cancelled.set()

    async def _probe_turn(self, session_id: str, steps: str) -> str:
        for step in json.loads(steps):
            what, *args = step
            try:
                if what == "read":
                    with open(args[0], encoding="utf-8") as f:
                        value: Any = f.read()
                elif what == "list":
                    value = sorted(os.listdir(args[0]))
                else:
                    raise OSError(errno.EINVAL, f"unknown probe step {what}")
                line = {"step": step, "ok": True, "value": value}
            except OSError as e:
                line = {"step": step, "ok": False, "code": errno.errorcode.get(e.errno or 0, str(e))}
            await self._conn.session_update(session_id=session_id,
                                            update=update_agent_message_text(json.dumps(line) + "\n"))
        return "end_turn"

    async def _cost_turn(self, session_id: str, figures: list[str], turn: Turn) -> str:
        used = 0
        for figure in figures:
            if turn.cancelled.is_set():
                return "cancelled"
            amount, _, currency = figure.partition(":")
            used += 100
            update = UsageUpdate(session_update="usage_update", used=used, size=200000,
                                 cost=Cost(amount=float(amount), currency=currency or "USD"))
            await self._conn.session_update(session_id=session_id, update=update)
            await self._conn.session_update(session_id=session_id,
                                            update=update_agent_message_text(f"cost {figure} "))
        return "cancelled" if turn.cancelled.is_set() else "end_turn"

    async def _echo_turn(self, session_id: str, text: str, turn: Turn) -> str:
        for piece in ("You ", "said: ", text):
            if turn.cancelled.is_set():
                return "cancelled"
            if piece:
                await self._conn.session_update(session_id=session_id, update=update_agent_message_text(piece))
        return "cancelled" if turn.cancelled.is_set() else "end_turn"

    async def _hang_turn(self, session_id: str, turn: Turn) -> str:
        await self._conn.session_update(
            session_id=session_id, update=update_agent_message_text("Hanging until session/cancel.")
        )
        await turn.cancelled.wait()
        return "cancelled"

    async def _tool_turn(self, session: Session, session_id: str, turn: Turn) -> str:
        target = os.path.join(session.cwd, "hello.txt")
        raw_input = {"path": target, "content": "hello"}
        await self._conn.session_update(
            session_id=session_id,
            update=start_tool_call(
                "call_1",
                "Write hello.txt",
                kind="edit",
                status="pending",
                locations=[ToolCallLocation(path=target)],
                raw_input=raw_input,
            ),
        )
        response = await self._conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(
                tool_call_id="call_1",
                title="Write hello.txt",
                kind="edit",
                status="pending",
                locations=[ToolCallLocation(path=target)],
                raw_input=raw_input,
            ),
            options=[
                PermissionOption(option_id="allow-once", name="Allow once", kind="allow_once"),
                PermissionOption(option_id="allow-always", name="Always allow", kind="allow_always"),
                PermissionOption(option_id="reject-once", name="Reject", kind="reject_once"),
            ],
        )
        outcome = response.outcome
        log.info("permission response: %s", response.model_dump_json(by_alias=True, exclude_none=True))
        allowed = outcome.outcome == "selected" and outcome.option_id in ("allow-once", "allow-always")
        cancelled = outcome.outcome == "cancelled" or turn.cancelled.is_set()
        status = "completed" if allowed and not cancelled else "failed"
        await self._conn.session_update(session_id=session_id, update=update_tool_call("call_1", status=status))
        return "cancelled" if cancelled else "end_turn"


async def main() -> None:
    await run_agent(TestAgent())
    log.info("connection closed (stdin EOF); exiting")


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=f"[{AGENT_NAME}] %(message)s")
    log.info("agent-client-protocol %s", importlib.metadata.version("agent-client-protocol"))
    asyncio.run(main())
