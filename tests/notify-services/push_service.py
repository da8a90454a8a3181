#!/usr/bin/env python3
"""A Web Push service stand-in on loopback, for tests/notify_channels.rs.

It checks what the gateway sends with libraries of its own (http_ece for
RFC 8291, PyJWT + cryptography for RFC 8292), never with the gateway's code:
it makes a browser's subscription (a P-256 key pair and an auth secret),
decrypts each push with the subscription's private key and verifies the
VAPID JWT with the public key the test says is the gateway's.

Usage: push_service.py VAPID_PUBLIC_KEY_B64URL
Prints one JSON line {"port", "p256dh", "auth"} when it listens, then serves:
  POST /push/ok    checks the push; 201 when every check passed, else 400
  POST /push/gone  410
  POST /push/fail  500 with a long body
  GET  /seen       what it saw of each push, as a JSON list
"""
import base64
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import http_ece
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def b64u(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


VAPID_PUBLIC = sys.argv[1]
SUBSCRIPTION = ec.generate_private_key(ec.SECP256R1())
AUTH = os.urandom(16)
P256DH = SUBSCRIPTION.public_key().public_bytes(
    serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
)
SEEN = []
LOCK = threading.Lock()


def check(handler, body):
    """What the push came to, as a dict; raises on the first failed check."""
    seen = {"headers": {k.lower(): v for k, v in handler.headers.items()}}
    origin = "http://127.0.0.1:%d" % handler.server.server_address[1]
    m = re.fullmatch(r"vapid t=([^,\s]+),\s*k=([A-Za-z0-9_-]+)", handler.headers.get("Authorization", ""))
    if not m:
        raise ValueError("Authorization is not 'vapid t=…, k=…'")
    token, k = m.groups()
    seen["k"] = k
    if k != VAPID_PUBLIC:
        raise ValueError("k is not the gateway's public key")
    key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64u(VAPID_PUBLIC))
    claims = jwt.decode(
        token, key=key, algorithms=["ES256"], audience=origin,
        options={"require": ["exp", "aud", "sub"]},
    )
    seen["claims"] = claims
    if claims["exp"] > time.time() + 24 * 3600:
        raise ValueError("exp is more than 24 hours away")
    if not re.match(r"^(mailto:|https://)", claims["sub"]):
        raise ValueError("sub is no mailto: or https: contact")
    seen["jwt_verified"] = True
    if handler.headers.get("Content-Encoding") != "aes128gcm":
        raise ValueError("Content-Encoding is not aes128gcm")
    plain = http_ece.decrypt(body, private_key=SUBSCRIPTION, auth_secret=AUTH, version="aes128gcm")
    seen["payload_b64"] = base64.b64encode(plain).decode()
    topic = handler.headers.get("Topic")
    if topic is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", topic):
        raise ValueError("Topic is not at most 32 base64url characters")
    if not re.fullmatch(r"[0-9]+", handler.headers.get("TTL", "")):
        raise ValueError("TTL is missing or not a number")
    return seen


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", kind="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/seen":
            return self.reply(404)
        with LOCK:
            self.reply(200, json.dumps(SEEN).encode(), "application/json")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        mode = self.path.rsplit("/", 1)[-1]
        if mode == "gone":
            return self.reply(410, b"subscription expired")
        if mode == "fail":
            return self.reply(500, b"x" * 300)
        try:
            seen = check(self, body)
            seen["ok"] = True
        except Exception as error:  # any failed check is reported, not raised
            seen = {"ok": False, "error": "%s: %s" % (type(error).__name__, error)}
        with LOCK:
            SEEN.append(seen)
        self.reply(201 if seen["ok"] else 400, seen.get("error", "").encode())


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(json.dumps({"port": server.server_address[1], "p256dh": b64u(P256DH), "auth": b64u(AUTH)}), flush=True)
server.serve_forever()
