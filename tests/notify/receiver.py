#!/usr/bin/env python3
"""A notification receiver for the tests, independent of the gateway's code:
it checks webhook signatures with Python's own hmac/hashlib.

Usage: receiver.py [--secret S] [--statuses 500,500,200]
Prints {"port": N} first, then one JSON line per request it got (printed
before it answers): path, headers (lower-case names), body (JSON or text),
signature_ok (null without --secret), and the status it answers (the
--statuses in order, then 200; 0: never answer).
"""
import argparse
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--secret")
parser.add_argument("--statuses", default="")
args = parser.parse_args()
statuses = [int(s) for s in args.statuses.split(",") if s]
# Requests are handled on threads: one at a time takes a status and prints.
lock = threading.Lock()


def signature_ok(header, body):
    """t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">, fresh."""
    if header is None:
        return False
    parts = dict(p.split("=", 1) for p in header.split(","))
    expected = hmac.new(
        args.secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    fresh = abs(time.time() - int(parts["t"])) < 300
    return fresh and hmac.compare_digest(expected, parts["v1"])


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with lock:
            status = self.record(body)
        if status == 0:
            # Never answers (until the process is killed).
            threading.Event().wait()
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def record(self, body):
        status = statuses.pop(0) if statuses else 200
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        record = {
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": parsed,
            "signature_ok": None
            if args.secret is None
            else signature_ok(self.headers.get("x-acp-gateway-signature"), body),
            "status": status,
        }
        print(json.dumps(record), flush=True)
        return status

    def log_message(self, *_):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(json.dumps({"port": server.server_address[1]}), flush=True)
server.serve_forever()
