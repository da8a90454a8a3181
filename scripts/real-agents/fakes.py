"""What the scripted model stand-ins share: an HTTP/1.1 handler on
loopback that logs each request's JSON body (JSON lines, to the file named
by the environment variable the fake gives) and answers whole bodies; and
the command a prompt asks to be run (`RUN<<command>>`, JSON-escaped)."""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: The environment variable naming the log file.
    log_variable = "FAKE_LOG"

    def log_message(self, *args):
        pass

    def logged_body(self):
        """The request's JSON body, logged with its path."""
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        with open(os.environ.get(self.log_variable, "/dev/null"), "a") as log:
            log.write(json.dumps({"path": self.path, "body": body}) + "\n")
        return body

    def reply(self, data, content_type="application/json"):
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def command_in(text):
    """The command between `RUN<<` and `>>` in (JSON) text, or None."""
    if "RUN<<" not in text:
        return None
    return json.loads('"' + text.split("RUN<<", 1)[1].split(">>", 1)[0] + '"')


def serve(handler):
    """Serves on a free loopback port, printed first on stdout."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
