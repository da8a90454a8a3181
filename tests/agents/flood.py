"""A hostile ACP agent for acp-gateway's tests: it floods its stdout with
output the gateway has to drop (or ignore), then answers as usual.

Plain JSON-RPC 2.0 over stdio, one message per line, standard library only
(what it tests is the bytes, not an SDK). The first word of a prompt's text
says what to write before the answer (N in MiB):

  garbage N   N MiB of lines that are not JSON (1 KiB each)
  noeol N     N MiB without a newline, then a newline
  longline N  one session/update line of N MiB (a message, but too long)
  ignored N   one notification of a method nobody knows, N MiB long
  forever     garbage lines until session/cancel comes: stopReason cancelled
  stubborn    garbage lines for ever; session/cancel changes nothing
  other       nothing

then one agent_message_chunk "done <word>" and stopReason end_turn. Its
stderr says how many bytes each flood wrote.
"""

import json
import sys
import threading

MIB = 1024 * 1024
OUT = sys.stdout.buffer
LOCK = threading.Lock()
CANCELLED = threading.Event()
SESSION = "flood-session"


def send(message):
    line = json.dumps(message).encode() + b"\n"
    with LOCK:
        OUT.write(line)
        OUT.flush()


def write_raw(data):
    with LOCK:
        OUT.write(data)
        OUT.flush()


def chunk_message(text):
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": SESSION,
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            },
        },
    }


def chunk(text):
    send(chunk_message(text))


GARBAGE_LINE = (b"this is not json " * 64)[:1023] + b"\n"
GARBAGE_BLOCK = GARBAGE_LINE * 1024  # 1 MiB


def flood(word, mib):
    if word == "garbage":
        for _ in range(mib):
            write_raw(GARBAGE_BLOCK)
    elif word == "noeol":
        block = b"x" * MIB
        for _ in range(mib):
            write_raw(block)
        write_raw(b"\n")
    elif word in ("longline", "ignored"):
        if word == "longline":
            head = chunk_message("@")
        else:
            head = {"jsonrpc": "2.0", "method": "_flood/ignored", "params": {"data": "@"}}
        before, after = json.dumps(head).encode().split(b"@")
        write_raw(before)
        block = b"y" * MIB
        for _ in range(mib):
            write_raw(block)
        write_raw(after + b"\n")
    elif word in ("forever", "stubborn"):
        while word == "stubborn" or not CANCELLED.is_set():
            write_raw(GARBAGE_BLOCK)
        return "cancelled"
    return "end_turn"


def prompt(request):
    CANCELLED.clear()
    blocks = request["params"].get("prompt", [])
    text = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    words = text.split()
    word = words[0] if words else ""
    mib = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    stop = flood(word, mib)
    print(f"flood {word} {mib} MiB written", file=sys.stderr, flush=True)
    if stop == "end_turn":
        chunk(f"done {word}")
    send({"jsonrpc": "2.0", "id": request["id"], "result": {"stopReason": stop}})


def main():
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method = message.get("method")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": 1,
                "agentCapabilities": {},
                "authMethods": [],
                "agentInfo": {"name": "flood", "version": "1"},
            }})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": message["id"], "result": {"sessionId": SESSION}})
        elif method == "session/prompt":
            # Prompts run beside the reading, so that a cancel is read while
            # the flood goes on.
            threading.Thread(target=prompt, args=(message,), daemon=True).start()
        elif method == "session/cancel":
            CANCELLED.set()
        elif "id" in message and method is not None:
            send({"jsonrpc": "2.0", "id": message["id"],
                  "error": {"code": -32601, "message": "method not found"}})


if __name__ == "__main__":
    main()
