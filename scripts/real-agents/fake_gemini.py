"""A scripted stand-in for the Gemini API (generateContent), on loopback,
for running Gemini CLI offline (GOOGLE_GEMINI_BASE_URL): a turn whose
prompt holds `RUN<<command>>` asks to run that command with
`run_shell_command`; the turn after the tool's response answers in text;
anything else (the CLI's own side requests) gets a short text. Every
request is logged (JSON lines) to the file named by FAKE_GEMINI_LOG; the
port is printed on stdout."""

import json

from fakes import Fake, command_in, serve

USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}


class Handler(Fake):
    log_variable = "FAKE_GEMINI_LOG"

    def do_GET(self):
        self.reply(b'{"models": []}')

    def do_POST(self):
        body = self.logged_body()
        if ":countTokens" in self.path:
            return self.reply(json.dumps({"totalTokens": 10}).encode())
        contents = body.get("contents", [])
        last = json.dumps(contents[-1:])
        tools = json.dumps(body.get("tools", []))
        command = command_in(last)
        if command and "functionResponse" not in last and "run_shell_command" in tools:
            parts = [{"functionCall": {"name": "run_shell_command",
                                       "args": {"command": command, "description": "Run what was asked"}}}]
        elif "functionResponse" in last:
            parts = [{"text": "The command ran."}]
        else:
            # The CLI's side requests (a next-speaker check, a title) want
            # JSON or a word: "user" serves both.
            wants_json = body.get("generationConfig", {}).get("responseMimeType") == "application/json"
            parts = [{"text": json.dumps({"reasoning": "done", "next_speaker": "user"}) if wants_json else "Done."}]
        response = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP",
                                    "index": 0}],
                    "usageMetadata": USAGE, "modelVersion": "fake"}
        if ":streamGenerateContent" in self.path:
            self.reply(f"data: {json.dumps(response)}\r\n\r\n".encode(), "text/event-stream")
        else:
            self.reply(json.dumps(response).encode())


serve(Handler)
