#!/usr/bin/env python3
"""A stand-in for Azure Key Vault's secrets REST API and Microsoft Entra ID's token endpoint,
for keyplan's tests only (tests/kms/azure.rs). It is NOT an emulator of the service and must
never hold real secrets: state is in memory, over plain HTTP on 127.0.0.1.

No Azure Key Vault emulator can be had where keyplan's tests run, so this models the subset
of the API that examples/azure-key-vault/keyplan-kms-azure uses, on the points its design
relies on (docs/kms/azure-key-vault.md):

  * POST /{tenant}/oauth2/v2.0/token: client credentials (`client_secret`, or
    `client_assertion` with the jwt-bearer assertion type); scope https://vault.azure.net/.default.
    Wrong credentials: 401 `invalid_client` (AADSTS7000215), as Entra ID answers.
  * Every vault call needs `Authorization: Bearer <the token issued>` and `api-version`,
    else 401 (with `WWW-Authenticate`) or 400.
  * PUT /secrets/{name}: a new version every time (no conditional writes), with a
    server-assigned 32-hex version id, `created`/`updated` in Unix seconds.
  * GET /secrets/{name}[/{version}]: no version = the latest created; a disabled version is
    refused with 403 `Forbidden` "Operation get is not allowed on a disabled secret.".
  * GET /secrets/{name}/versions: no values; pages of at most `--page-size` (default 2) items
    linked by an absolute `nextLink`; ordered by version id (deterministic, not by time, as
    the service's order is not chronological).
  * PATCH /secrets/{name}/{version}: `contentType`, `tags` (replaced whole),
    `attributes.enabled`.
  * DELETE /secrets/{name}: soft delete. A soft-deleted name answers GET and list with 404
    `SecretNotFound` and PUT with 409 `Conflict` / `ObjectIsDeletedButRecoverable`.
  * Every answer carries a `Date` header (the server's clock, whole seconds).
  * Names: [0-9A-Za-z-]{1,127}, case-insensitive; else 400 `BadParameter`.

What it does NOT model: RBAC or access policies (one token may do everything, unless
`--deny-writes` refuses PUT and PATCH with 403 `ForbiddenByRbac`), recovery and purge,
backups, expiry and not-before dates, certificates and keys, throttling (429), replication
lag or eventual consistency between vault front ends (its listings are always up to date,
so it cannot show the limits of the helper's compare-and-swap on real Azure), TLS, the
challenge-based authentication flow, token expiry, and the size limits of values and tags.

Usage: azure_key_vault.py --tenant T --client-id C --client-secret S [--federated-token F]
       [--page-size N] [--deny-writes]
It listens on 127.0.0.1, port chosen by the system, and prints `port <N>` on one line of
standard output once it accepts connections. It logs one line per request (method, path,
status; never bodies) on standard error.
"""

import argparse
import base64
import json
import re
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = re.compile(r"^[0-9A-Za-z-]{1,127}$")
SCOPE = "https://vault.azure.net/.default"

LOCK = threading.Lock()
SECRETS = {}  # lower-case name -> {"name": str, "deleted": bool, "versions": [version dict]}
TOKEN = "standin-" + secrets.token_hex(16)
ARGS = None


def bundle(host, s, v, with_value):
    out = {"id": "http://%s/secrets/%s/%s" % (host, s["name"], v["id"]),
           "attributes": {"enabled": v["enabled"], "created": v["created"], "updated": v["updated"],
                          "recoveryLevel": "Recoverable+Purgeable", "recoverableDays": 90},
           "tags": dict(v["tags"])}
    if v["content_type"] is not None:
        out["contentType"] = v["content_type"]
    if with_value:
        out["value"] = v["value"]
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))

    def reply(self, status, body, headers=None):
        data = json.dumps(body).encode()
        self.send_response(status)  # adds Date
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, code, message, inner=None, headers=None):
        err = {"code": code, "message": message}
        if inner:
            err["innererror"] = {"code": inner}
        self.reply(status, {"error": err}, headers)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # ------------------------------------------------------------------ token endpoint
    def token(self, tenant):
        form = urllib.parse.parse_qs(self.body().decode(), keep_blank_values=True)
        one = lambda k: (form.get(k) or [None])[0]
        if tenant != ARGS.tenant:
            return self.reply(400, {"error": "invalid_request",
                                    "error_description": "AADSTS90002: Tenant '%s' not found." % tenant})
        if one("grant_type") != "client_credentials" or one("scope") != SCOPE:
            return self.reply(400, {"error": "invalid_scope" if one("scope") != SCOPE else "unsupported_grant_type",
                                    "error_description": "AADSTS70011: The provided request must include a valid scope."})
        ok = one("client_id") == ARGS.client_id and (
            (one("client_secret") is not None and one("client_secret") == ARGS.client_secret)
            or (ARGS.federated_token is not None and one("client_assertion") == ARGS.federated_token
                and one("client_assertion_type") == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"))
        if not ok:
            return self.reply(401, {"error": "invalid_client",
                                    "error_description": "AADSTS7000215: Invalid client secret provided. Ensure the "
                                                         "secret being sent in the request is the client secret value, "
                                                         "not the client secret ID."})
        self.reply(200, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": TOKEN})

    # ------------------------------------------------------------------ vault
    def vault(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            return self.error(401, "Unauthorized", "AKV10000: Request is missing a Bearer or PoP token.",
                              headers={"WWW-Authenticate": 'Bearer authorization="http://%s/%s", resource="https://vault.azure.net"'
                                       % (self.headers.get("Host"), ARGS.tenant)})
        if (query.get("api-version") or [None])[0] is None:
            return self.error(400, "BadParameter", "The request URI contains an invalid API version.")
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        if len(parts) < 2 or parts[0] != "secrets" or len(parts) > 3:
            return self.error(404, "NotFound", "The requested path is not part of this API.")
        name = parts[1]
        if not NAME.match(name):
            return self.error(400, "BadParameter", "The request URI contains an invalid name: %s" % name)
        if ARGS.deny_writes and method in ("PUT", "PATCH"):
            return self.error(403, "Forbidden", "Caller is not authorized to perform action on resource. "
                                                "Action: 'Microsoft.KeyVault/vaults/secrets/setSecret/action'",
                              inner="ForbiddenByRbac")
        host = self.headers.get("Host")
        with LOCK:
            s = SECRETS.get(name.lower())
            if method == "PUT" and len(parts) == 2:
                return self.put(host, name, s)
            if s is None or s["deleted"]:
                return self.error(404, "SecretNotFound", "A secret with (name/id) %s was not found in this key vault. "
                                                             "If you recently deleted this secret you may be able to "
                                                             "recover it using the correct recovery command." % name)
            if method == "DELETE" and len(parts) == 2:
                s["deleted"] = True
                return self.reply(200, {"recoveryId": "http://%s/deletedsecrets/%s" % (host, s["name"]),
                                        "deletedDate": int(time.time())})
            if method == "GET" and len(parts) == 3 and parts[2] == "versions":
                return self.list(host, s, query)
            version = parts[2] if len(parts) == 3 else None
            if version is None and method == "GET":
                v = max(s["versions"], key=lambda v: v["seq"])
            else:
                v = next((x for x in s["versions"] if x["id"] == version), None)
            if v is None:
                return self.error(404, "SecretNotFound", "A secret with (name/id) %s/%s was not found in this key vault."
                                  % (name, version))
            if method == "GET":
                if not v["enabled"]:
                    return self.error(403, "Forbidden", "Operation get is not allowed on a disabled secret.")
                return self.reply(200, bundle(host, s, v, True))
            if method == "PATCH":
                try:
                    req = json.loads(self.body() or b"{}")
                except ValueError:
                    return self.error(400, "BadParameter", "The request body is not JSON.")
                if "tags" in req:
                    v["tags"] = {str(k): str(x) for k, x in (req["tags"] or {}).items()}
                if "contentType" in req:
                    v["content_type"] = req["contentType"]
                enabled = (req.get("attributes") or {}).get("enabled")
                if enabled is not None:
                    v["enabled"] = bool(enabled)
                v["updated"] = int(time.time())
                return self.reply(200, bundle(host, s, v, False))
        return self.error(405, "BadParameter", "Method not allowed.")

    def put(self, host, name, s):
        if s is not None and s["deleted"]:
            return self.error(409, "Conflict", "Secret %s is currently in a deleted but recoverable state, and its "
                                               "name cannot be reused; in this state, the secret can only be "
                                               "recovered or purged." % name, inner="ObjectIsDeletedButRecoverable")
        try:
            req = json.loads(self.body())
        except ValueError:
            return self.error(400, "BadParameter", "The request body is not JSON.")
        if not isinstance(req, dict) or not isinstance(req.get("value"), str):
            return self.error(400, "BadParameter", "Property 'value' is required.")
        if s is None:
            s = SECRETS[name.lower()] = {"name": name, "deleted": False, "versions": []}
        now = int(time.time())
        v = {"id": secrets.token_hex(16), "value": req["value"], "content_type": req.get("contentType"),
             "tags": {str(k): str(x) for k, x in (req.get("tags") or {}).items()},
             "enabled": (req.get("attributes") or {}).get("enabled", True) is not False,
             "created": now, "updated": now, "seq": len(s["versions"])}
        s["versions"].append(v)
        self.reply(200, bundle(host, s, v, True))

    def list(self, host, s, query):
        try:
            size = min(int((query.get("maxresults") or ["25"])[0]), 25, ARGS.page_size)
            skip = int(base64.urlsafe_b64decode((query.get("$skiptoken") or ["MA=="])[0]).decode())
        except ValueError:
            return self.error(400, "BadParameter", "Bad paging parameters.")
        ordered = sorted(s["versions"], key=lambda v: v["id"])
        page = ordered[skip:skip + size]
        out = {"value": [bundle(host, s, v, False) for v in page], "nextLink": None}
        if skip + size < len(ordered):
            token = base64.urlsafe_b64encode(str(skip + size).encode()).decode()
            out["nextLink"] = "http://%s/secrets/%s/versions?api-version=7.4&maxresults=%d&$skiptoken=%s" % (
                host, s["name"], size, token)
        self.reply(200, out)

    # ------------------------------------------------------------------ dispatch
    def route(self, method):
        path = urllib.parse.urlsplit(self.path).path
        m = re.match(r"^/([^/]+)/oauth2/v2\.0/token$", path)
        if m and method == "POST":
            return self.token(m.group(1))
        return self.vault(method)

    def do_GET(self):
        self.route("GET")

    def do_PUT(self):
        self.route("PUT")

    def do_PATCH(self):
        self.route("PATCH")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")


def main():
    global ARGS
    p = argparse.ArgumentParser(description="Azure Key Vault stand-in for keyplan's tests")
    p.add_argument("--tenant", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--client-secret", required=True)
    p.add_argument("--federated-token")
    p.add_argument("--page-size", type=int, default=2)
    p.add_argument("--deny-writes", action="store_true")
    ARGS = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    sys.stdout.write("port %d\n" % server.server_address[1])
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
