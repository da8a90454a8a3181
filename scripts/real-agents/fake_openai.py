"""A scripted stand-in for the OpenAI Responses API (`/responses`, for
Codex through a custom model provider) and Chat Completions API
(`/chat/completions`, for OpenCode through an OpenAI-compatible provider),
on loopback, for running those agents offline: a turn whose prompt holds
`RUN<<command>>` asks to run that command with the shell tool the agent
offers (`shell_command`, `exec_command`, `shell` or `bash`, whichever its
request lists); the turn after the tool's output answers in text. Every
request is logged (JSON lines) to the file named by FAKE_OPENAI_LOG; the
port is printed on stdout."""

import json

from fakes import Fake, command_in, serve


def sse(data):
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def shell_call(tools, command):
    """The function call that runs `command` with the shell tool offered."""
    names = [t.get("name") or t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    if "bash" in names:
        return "bash", {"command": command, "description": "Run what was asked"}
    if "shell_command" in names:
        return "shell_command", {"command": command}
    if "exec_command" in names:
        return "exec_command", {"cmd": command}
    return "shell", {"command": ["bash", "-lc", command]}


class Handler(Fake):
    log_variable = "FAKE_OPENAI_LOG"

    def do_GET(self):
        self.reply(b'{"data": [], "models": []}')

    def do_POST(self):
        body = self.logged_body()
        if self.path.endswith("/chat/completions"):
            return self.chat(body)
        items = body.get("input", [])
        answered = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
        text = json.dumps(items)
        events = [{"type": "response.created", "response": {"id": "resp_fake"}}]
        command = command_in(text)
        if command and not answered:
            name, args = shell_call(body.get("tools", []), command)
            events.append({"type": "response.output_item.done", "output_index": 0, "item": {
                "type": "function_call", "id": "fc_fake", "call_id": "call_fake_1",
                "name": name, "arguments": json.dumps(args), "status": "completed"}})
        else:
            answer = "The command ran." if answered else "Nothing to run."
            events.append({"type": "response.output_text.delta", "item_id": "msg_fake",
                           "output_index": 0, "content_index": 0, "delta": answer})
            events.append({"type": "response.output_item.done", "output_index": 0, "item": {
                "type": "message", "id": "msg_fake", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}]}})
        events.append({"type": "response.completed", "response": {"id": "resp_fake", "usage": {
            "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15}}})
        self.reply(b"".join(sse(e) for e in events), "text/event-stream")

    def chat(self, body):
        """Chat Completions, streamed."""
        messages = body.get("messages", [])
        answered = bool(messages) and messages[-1].get("role") == "tool"
        text = json.dumps([m for m in messages if m.get("role") == "user"][-1:])
        chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}
        tools = body.get("tools", [])
        command = command_in(text)
        if command and not answered and tools:
            name, args = shell_call(tools, command)
            deltas = [({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_fake_1", "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)}}]}, None),
                      ({}, "tool_calls")]
        else:
            answer = "The command ran." if answered else "Done."
            deltas = [({"role": "assistant", "content": answer}, None), ({}, "stop")]
        out = b""
        for delta, finish in deltas:
            data = {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if finish:
                data["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
            out += f"data: {json.dumps(data)}\n\n".encode()
        out += b"data: [DONE]\n\n"
        self.reply(out, "text/event-stream")


serve(Handler)
