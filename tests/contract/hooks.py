"""Hooks scripts/contract loads into schemathesis (SCHEMATHESIS_HOOKS).

A WebSocket handshake the gateway accepts is answered 101 Switching Protocols,
and the connection then speaks WebSocket. Python's HTTP client does not know
that: it would put the connection back in its pool and send the next generated
request over it. Here a connection that switched protocols is closed instead,
as any HTTP client must; nothing else of schemathesis changes.
"""

import requests.adapters

_build_response = requests.adapters.HTTPAdapter.build_response


def _build_response_closing_switched(self, req, resp):
    response = _build_response(self, req, resp)
    if resp.status == 101:
        connection = getattr(resp, "connection", None)
        if connection is not None:
            connection.close()
    return response


requests.adapters.HTTPAdapter.build_response = _build_response_closing_switched
