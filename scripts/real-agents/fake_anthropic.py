"""A scripted stand-in for the Anthropic Messages API, on loopback, for
running Claude Code (claude-agent-acp) offline: the first conversation
turn asks to run a shell command (a tool_use of Bash: `echo hello >
greeting.txt` when the prompt says "run the greeting", the command between
`RUN<<` and `>>` when it holds one), the turn after the tool's result
answers in text. Every request is logged (JSON lines) to the
file named by FAKE_ANTHROPIC_LOG; the port is printed on stdout."""

import json

from fakes import Fake, command_in, serve


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class Handler(Fake):
    log_variable = "FAKE_ANTHROPIC_LOG"

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        self.reply(b"{}")

    def do_POST(self):
        body = self.logged_body()
        if "count_tokens" in self.path:
            return self.json({"input_tokens": 10})
        messages = body.get("messages", [])
        last = messages[-1] if messages else {}
        content = last.get("content")
        has_result = isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )
        text_of = json.dumps(messages)
        command = None
        if not has_result:
            command = command_in(text_of)
            if command is None and "run the greeting" in text_of:
                command = "echo hello > greeting.txt"
        if body.get("stream"):
            self.stream(body.get("model", "claude"), command)
        else:
            self.json(
                {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "claude"),
                    "content": [{"type": "text", "text": "Greeting"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 2},
                }
            )

    def json(self, value):
        self.reply(json.dumps(value).encode())

    def stream(self, model, command):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        out = self.wfile
        out.write(sse("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}))
        if command:
            out.write(sse("content_block_start", {"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_fake_1", "name": "Bash", "input": {}}}))
            args = json.dumps({"command": command, "description": "Run what was asked"})
            out.write(sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": args}}))
            out.write(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
            stop = "tool_use"
        else:
            out.write(sse("content_block_start", {"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}))
            out.write(sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "The greeting is written."}}))
            out.write(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
            stop = "end_turn"
        out.write(sse("message_delta", {"type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 5}}))
        out.write(sse("message_stop", {"type": "message_stop"}))
        out.flush()
        self.close_connection = True


serve(Handler)
