"""A scripted stand-in for the Gemini API (generateContent), on loopback,
for running Gemini CLI offline (GOOGLE_GEMINI_BASE_URL): a turn whose
prompt holds `RUN<<command>>` asks to run that command with
`run_shell_command`; the turn after the tool's response answers in text;
anything else (the CLI's own side requests) gets a short text. Every
request is logged (JSON lines) to the file named by FAKE_GEMINI_LOG; the
port is printed on stdout."""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = os.environ.get("FAKE_GEMINI_LOG", "/dev/null")
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.reply(b'{"models": []}', "application/json")

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        with open(LOG, "a") as log:
            log.write(json.dumps({"path": self.path, "body": body}) + "\n")
        if ":countTokens" in self.path:
            return self.reply(json.dumps({"totalTokens": 10}).encode(), "application/json")
        contents = body.get("contents", [])
        last = json.dumps(contents[-1:])
        tools = json.dumps(body.get("tools", []))
        if "RUN<<" in last and "functionResponse" not in last and "run_shell_command" in tools:
            command = json.loads('"' + last.split("RUN<<", 1)[1].split(">>", 1)[0] + '"')
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
            self.reply(json.dumps(response).encode(), "application/json")

    def reply(self, data, content_type):
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
