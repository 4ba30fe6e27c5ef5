#!/usr/bin/env python3
"""A local STAND-IN for IBM Key Protect's REST API v2 and IBM Cloud IAM's token endpoint, for
keyplan's tests only (tests/kms/ibm.rs). It is not Key Protect, not an emulator of it, and not
for anything but tests: no emulator of Key Protect exists, so the tests run the helper
examples/ibm-key-protect/keyplan-kms-keyprotect against this, and docs/kms/ibm-key-protect.md
says how to run the same contract against a real instance.

    python3 ibm_key_protect.py --instance GUID --api-key KEY=ROLE [--api-key KEY=ROLE ...]

Listens on 127.0.0.1, port 0 (the kernel picks one) and prints `port <N>` on one line of
standard output once it accepts connections. State is in memory only.

What it models (as documented by IBM; the test suite depends on these):
  * POST /identity/token (form grant_type=urn:ibm:params:oauth:grant-type:apikey, apikey=...):
    an unknown API key answers 400 (BXNIM0415E), a known one a random bearer token. Each API
    key has one service role: Reader, ReaderPlus, Writer or Manager.
  * Every /api/v2 request: a missing or unknown bearer token answers 401; a `bluemix-instance`
    header other than the instance answers 404 (an assumption: what the real service answers
    for an instance the token cannot see may differ); a role too weak answers 403.
  * POST /api/v2/keys: one key per request; server-assigned UUID ids; standard keys
    (`extractable: true`) keep `payload` (base64; generated when absent); up to 5 aliases, each
    2-90 characters of letters, digits, '-' and '_', not a UUID, unique in the instance: an
    alias in use answers 409 (KEY_ALIAS_NOT_UNIQUE_ERR). Aliases of deleted keys stay reserved.
  * GET /api/v2/keys/<id or alias>: the key with its payload (ReaderPlus); 404 when unknown,
    410 (KEY_DELETED_ERR) when deleted. GET .../metadata: without payload (Reader), deleted keys
    too, with `state: 5` and `deleted: true`.
  * DELETE /api/v2/keys/<id or alias> (Manager): the key becomes `state: 5`, its payload is
    destroyed; a second DELETE answers 410.
  * GET /api/v2/keys?limit=&offset=: metadata of the keys that are not deleted, paged.

What it does NOT model: key rings, policies (dual authorization, rotation), import tokens,
root keys' wrap/unwrap/rotate, key versions, restore and purge, registrations, regions and
private endpoints, token expiry and refresh, rate limits, eventual consistency, TLS, CRNs,
IAM policies finer than one role per API key, and the exact texts of real error messages.

Test hooks (not Key Protect's API; no authentication): `/_standin/...`
  * GET  /_standin/keys: every key, deleted ones too, WITH payloads (an independent witness).
  * POST /_standin/hang {"alias_contains": S, "payload_contains": P, "mode": "before"|"after"}:
    the next matching create (POST /api/v2/keys with an alias containing S and a payload
    containing P) hangs: `before`
    without creating anything, `after` once the key exists; the connection is closed when the
    rule is cleared (DELETE /_standin/hang) or the server stops. Answers once armed.
"""

import argparse
import base64
import binascii
import json
import os
import re
import sys
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLES = ["Reader", "ReaderPlus", "Writer", "Manager"]
ALIAS = re.compile(r"^[A-Za-z0-9_-]{2,90}$")
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
KEY_TYPE = "application/vnd.ibm.kms.key+json"


class State:
    def __init__(self, instance, api_keys):
        self.lock = threading.Lock()
        self.instance = instance
        self.api_keys = api_keys      # api key -> role
        self.tokens = {}              # token -> role
        self.keys = {}                # id -> key dict (with "payload" bytes or None)
        self.order = []
        self.aliases = {}             # alias -> id
        self.hang = None              # the armed hang rule
        self.released = threading.Event()


def now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def error(status, code, message):
    return status, {"metadata": {"collectionType": "application/vnd.ibm.kms.error+json", "collectionTotal": 1},
                    "resources": [{"errorMsg": message, "reasons": [
                        {"code": code, "message": message, "status": status,
                         "moreInfo": "https://cloud.ibm.com/apidocs/key-protect"}]}]}


def collection(keys):
    return {"metadata": {"collectionType": KEY_TYPE, "collectionTotal": len(keys)}, "resources": keys}


def public(key, payload):
    out = {k: v for k, v in key.items() if k != "payload"}
    if payload and key["payload"] is not None:
        out["payload"] = base64.b64encode(key["payload"]).decode()
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None  # set by main

    def log_message(self, fmt, *args):  # one line per request on stderr: method, path, status
        sys.stderr.write("%s %s\n" % (self.command, fmt % args))

    def reply(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def route(self, method):
        path, _, query = self.path.partition("?")
        raw = self.body()
        st = self.state
        if path.startswith("/_standin/"):
            return self.reply(*self.hook(method, path, raw))
        if path == "/identity/token" and method == "POST":
            return self.reply(*self.token(raw))
        if not path.startswith("/api/v2/"):
            return self.reply(*error(404, "NOT_FOUND", "Not Found"))
        auth = self.headers.get("Authorization", "")
        with st.lock:
            role = st.tokens.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
        if role is None:
            return self.reply(*error(401, "UNAUTHORIZED_ERR", "Unauthorized: The user does not have access to the specified resource"))
        if self.headers.get("bluemix-instance") != st.instance:
            return self.reply(*error(404, "INSTANCE_NOT_FOUND_ERR", "Not Found: the instance does not exist"))
        parts = path[len("/api/v2/"):].split("/")
        if parts[0] != "keys":
            return self.reply(*error(404, "NOT_FOUND", "Not Found"))
        need = {"GET": "Reader", "POST": "Writer", "DELETE": "Manager"}[method]
        if method == "GET" and len(parts) == 2:
            need = "ReaderPlus"
        if ROLES.index(role) < ROLES.index(need):
            return self.reply(*error(403, "FORBIDDEN_ERR", "Forbidden: the %s role is needed, the token has %s" % (need, role)))
        if method == "POST" and len(parts) == 1:
            return self.create(raw)
        if method == "GET" and len(parts) == 1:
            return self.reply(*self.list(query))
        if len(parts) in (2, 3) and parts[1]:
            if len(parts) == 3 and parts[2] != "metadata":
                return self.reply(*error(404, "NOT_FOUND", "Not Found"))
            return self.reply(*self.one(method, parts[1], metadata=len(parts) == 3))
        return self.reply(*error(404, "NOT_FOUND", "Not Found"))

    def token(self, raw):
        from urllib.parse import parse_qs
        form = parse_qs(raw.decode("utf-8", "replace"))
        key = (form.get("apikey") or [""])[0]
        if (form.get("grant_type") or [""])[0] != "urn:ibm:params:oauth:grant-type:apikey":
            return 400, {"errorCode": "BXNIM0109E", "errorMessage": "Property missing or empty."}
        with self.state.lock:
            role = self.state.api_keys.get(key)
            if role is None:
                return 400, {"errorCode": "BXNIM0415E", "errorMessage": "Provided API key could not be found."}
            token = uuid.uuid4().hex + uuid.uuid4().hex
            self.state.tokens[token] = role
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": 3600}

    def create(self, raw):
        st = self.state
        try:
            req = json.loads(raw.decode("utf-8"))
            res = req["resources"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return self.reply(*error(400, "BAD_BODY_ERR", "Invalid body data was passed"))
        if not isinstance(res, list) or len(res) != 1 or not isinstance(res[0], dict):
            return self.reply(*error(400, "BAD_BODY_ERR", "Only creation of one key per request is supported"))
        spec = res[0]
        aliases = spec.get("aliases") or []
        if not isinstance(aliases, list) or len(aliases) > 5 or \
                any(not isinstance(a, str) or not ALIAS.match(a) or UUID_RE.match(a) for a in aliases):
            return self.reply(*error(400, "BAD_BODY_ERR", "Invalid alias"))
        name = spec.get("name")
        if not isinstance(name, str) or not 2 <= len(name) <= 90:
            return self.reply(*error(400, "BAD_BODY_ERR", "Key name must be 2 to 90 characters"))
        extractable = spec.get("extractable") is True
        payload = None
        if spec.get("payload"):
            try:
                payload = base64.b64decode(spec["payload"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                return self.reply(*error(400, "BAD_BODY_ERR", "payload is not base64"))
        elif extractable:
            payload = os.urandom(32)
        key_id = str(uuid.uuid4())
        key = {"type": KEY_TYPE, "id": key_id, "name": name, "description": spec.get("description", ""),
               "aliases": aliases, "extractable": extractable, "state": 1, "creationDate": now(),
               "lastUpdateDate": now(), "imported": bool(spec.get("payload")), "deleted": False,
               "crn": "crn:v1:standin:public:kms:local:a/test:%s:key:%s" % (st.instance, key_id),
               "payload": payload}
        rule = None
        with st.lock:
            h = st.hang
            if h and h["method"] == "POST" and any(h["alias_contains"] in a for a in aliases) \
                    and h["payload_contains"].encode() in (payload or b""):
                rule, st.hang = h, None
            if rule is None or rule["mode"] == "after":
                taken = [a for a in aliases if a in st.aliases]
                if taken:
                    return self.reply(*error(409, "KEY_ALIAS_NOT_UNIQUE_ERR",
                                             "Conflict: alias %s already exists in this instance" % taken[0]))
                st.keys[key_id] = key
                st.order.append(key_id)
                for a in aliases:
                    st.aliases[a] = key_id
        if rule is not None:
            st.released.wait()  # hang until the rule is cleared or the server stops
            self.close_connection = True
            return None
        return self.reply(201, collection([public(key, payload=False)]))

    def lookup(self, ref):
        key_id = ref if ref in self.state.keys else self.state.aliases.get(ref)
        return self.state.keys.get(key_id) if key_id else None

    def one(self, method, ref, metadata):
        st = self.state
        with st.lock:
            key = self.lookup(ref)
            if key is None:
                return error(404, "KEY_NOT_FOUND_ERR", "Not Found: Key does not exist")
            if method == "GET":
                if key["deleted"] and not metadata:
                    return error(410, "KEY_DELETED_ERR", "Key has already been deleted: Please delete references to this key")
                return 200, collection([public(key, payload=not metadata)])
            if key["deleted"]:
                return error(410, "KEY_DELETED_ERR", "Key has already been deleted: Please delete references to this key")
            key.update(deleted=True, state=5, payload=None, deletionDate=now())
            return 204, None

    def list(self, query):
        from urllib.parse import parse_qs
        q = parse_qs(query)
        try:
            limit = int((q.get("limit") or ["200"])[0])
            offset = int((q.get("offset") or ["0"])[0])
        except ValueError:
            return error(400, "BAD_BODY_ERR", "limit and offset must be numbers")
        with self.state.lock:
            keys = [public(self.state.keys[i], payload=False) for i in self.state.order
                    if not self.state.keys[i]["deleted"]]
        if (q.get("extractable") or [""])[0] == "true":
            keys = [k for k in keys if k["extractable"]]
        return 200, collection(keys[offset:offset + limit])

    def hook(self, method, path, raw):
        st = self.state
        if path == "/_standin/keys" and method == "GET":
            with st.lock:
                keys = [public(st.keys[i], payload=True) for i in st.order]
            return 200, collection(keys)
        if path == "/_standin/hang" and method == "POST":
            rule = json.loads(raw.decode("utf-8"))
            with st.lock:
                st.released.clear()
                st.hang = {"method": rule.get("method", "POST"), "alias_contains": rule["alias_contains"],
                           "mode": rule.get("mode", "before"),
                           "payload_contains": rule.get("payload_contains", "")}
            return 200, {"armed": st.hang}
        if path == "/_standin/hang" and method == "DELETE":
            with st.lock:
                st.hang = None
            st.released.set()
            return 200, {}
        return 404, {"error": "no such hook"}


def main():
    p = argparse.ArgumentParser(description="Key Protect stand-in for keyplan's tests")
    p.add_argument("--instance", required=True)
    p.add_argument("--api-key", action="append", default=[], help="KEY=ROLE")
    args = p.parse_args()
    api_keys = {}
    for item in args.api_key:
        key, _, role = item.rpartition("=")
        if role not in ROLES or not key:
            p.error("--api-key wants KEY=ROLE with ROLE one of %s" % ", ".join(ROLES))
        api_keys[key] = role
    Handler.state = State(args.instance, api_keys)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print("port %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    finally:
        Handler.state.released.set()


if __name__ == "__main__":
    main()
