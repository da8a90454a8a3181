#!/usr/bin/env python3
"""An FCM stand-in on loopback (OAuth token endpoint + HTTP v1 send), for
tests/notify_channels.rs.

It makes a service account of its own (an RSA key by cryptography, written
as a Firebase JSON key file whose token_uri points here), verifies each
token request's JWT assertion with that account's public key (PyJWT), never
with the gateway's code, and admits a send only with a token it issued.

Usage: fcm_service.py SERVICE_ACCOUNT_FILE_TO_WRITE [EXPIRES_IN]
(EXPIRES_IN: the lifetime of the tokens it issues, default 3599 seconds)
Prints one JSON line {"port"} when it listens, then serves:
  POST /token                                   the JWT bearer grant
  POST /v1/projects/test-project/messages:send  201-free FCM: 200 {"name"},
       404 UNREGISTERED for the device token "gone-device", 401 for a token
       not issued or revoked, 400 INVALID_ARGUMENT for a message whose
       notification and data carry more than 4,000 bytes (keys and values)
  POST /revoke   forgets every token issued (the next send is 401)
  POST /stall    token requests from now on are held unanswered (each is
                 seen at once, with "stalled": true) until
  POST /unstall  which answers those still held and lets the next ones be
  GET  /seen     {"token_requests": [...], "sends": [...]}
"""
import json
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

PROJECT = "test-project"
EMAIL = "gateway@test-project.iam.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PUBLIC = KEY.public_key()
EXPIRES_IN = int(sys.argv[2]) if len(sys.argv) > 2 else 3599
ISSUED = set()
SEEN = {"token_requests": [], "sends": []}
LOCK = threading.Lock()
# Clear while token requests stall: they wait until it is set again.
FLOWING = threading.Event()
FLOWING.set()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, value):
        body = json.dumps(value).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a held request whose client gave up

    def do_GET(self):
        if self.path != "/seen":
            return self.reply(404, {})
        with LOCK:
            self.reply(200, SEEN)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/token":
            return self.token(body)
        if self.path == "/revoke":
            with LOCK:
                ISSUED.clear()
            return self.reply(200, {})
        if self.path == "/stall":
            FLOWING.clear()
            return self.reply(200, {})
        if self.path == "/unstall":
            FLOWING.set()
            return self.reply(200, {})
        if self.path == "/v1/projects/%s/messages:send" % PROJECT:
            return self.send(body)
        body = b"<html><body>404 Not Found</body></html>"  # as Google's front end answers
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def token(self, body):
        if not FLOWING.is_set():
            with LOCK:
                SEEN["token_requests"].append({"stalled": True})
            FLOWING.wait(120)
        form = urllib.parse.parse_qs(body.decode())
        seen = {"content_type": self.headers.get("Content-Type")}
        try:
            if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
                raise ValueError("grant_type is not the JWT bearer grant")
            token_uri = "http://127.0.0.1:%d/token" % self.server.server_address[1]
            claims = jwt.decode(
                form["assertion"][0], key=PUBLIC, algorithms=["RS256"], audience=token_uri,
                issuer=EMAIL, options={"require": ["exp", "iat", "iss", "aud", "scope"]},
            )
            if claims["scope"] != SCOPE:
                raise ValueError("scope is not firebase.messaging")
            if claims["exp"] - claims["iat"] > 3600:
                raise ValueError("the assertion lives longer than an hour")
            seen["claims"] = claims
            seen["ok"] = True
        except Exception as error:
            seen["ok"] = False
            seen["error"] = "%s: %s" % (type(error).__name__, error)
        with LOCK:
            SEEN["token_requests"].append(seen)
        if not seen["ok"]:
            return self.reply(400, {"error": "invalid_grant", "error_description": seen["error"]})
        access = "ya29.test-" + secrets.token_urlsafe(16)
        with LOCK:
            ISSUED.add(access)
        self.reply(200, {"access_token": access, "expires_in": EXPIRES_IN, "token_type": "Bearer"})

    def send(self, body):
        bearer = self.headers.get("Authorization", "")
        message = json.loads(body)["message"]
        # What FCM's 4,000-byte limit counts: keys and values, in UTF-8.
        carried = list(message.get("data", {}).items())
        carried += list(message.get("notification", {}).items())
        size = sum(len(k.encode()) + len(str(v).encode()) for k, v in carried)
        with LOCK:
            admitted = bearer.startswith("Bearer ") and bearer[len("Bearer "):] in ISSUED
            SEEN["sends"].append({"admitted": admitted, "size": size, "body": json.loads(body)})
        if not admitted:
            return self.reply(401, {"error": {"code": 401, "status": "UNAUTHENTICATED"}})
        if size > 4000:
            return self.reply(400, {"error": {
                "code": 400, "message": "Request contains an invalid argument.",
                "status": "INVALID_ARGUMENT",
                "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                             "errorCode": "INVALID_ARGUMENT"}]}})
        if message["token"] == "gone-device":
            return self.reply(404, {"error": {
                "code": 404, "message": "Requested entity was not found.", "status": "NOT_FOUND",
                "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                             "errorCode": "UNREGISTERED"}]}})
        self.reply(200, {"name": "projects/%s/messages/%d" % (PROJECT, time.time_ns())})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
port = server.server_address[1]
pem = KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
).decode()
with open(sys.argv[1], "w") as f:
    json.dump({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "test-key-1",
        "private_key": pem, "client_email": EMAIL, "client_id": "1",
        "token_uri": "http://127.0.0.1:%d/token" % port,
    }, f)
print(json.dumps({"port": port}), flush=True)
server.serve_forever()
