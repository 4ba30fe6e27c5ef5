//! Vault/OpenBao authentication (issue 14): AppRole (secret ID from a file or a variable),
//! Kubernetes auth (a TokenRequest token of a real ServiceAccount, checked by the server with a
//! TokenReview against the real API server of tests/common/kube.rs, its reviewer a
//! ServiceAccount bound to `system:auth-delegator`), TLS certificate auth, renewal of a renewable token at `apply`, and
//! `status` reporting the token's expiry; refused logins and expired tokens stop with an error
//! naming the KMS and change nothing. Everything against the real OpenBao server, from the CLI.

use crate::common::kube;
use crate::common::openbao;
use crate::common::pykmip;

use std::path::Path;

use crate::common::*;
use base64::Engine as _;

/// The policy keyplan needs for keys under `rook/` (docs/kms/vault.md).
const POLICY: &str = r#"
path "secret/data/rook/*"     { capabilities = ["create", "read", "update"] }
path "secret/metadata/rook/*" { capabilities = ["read", "delete"] }
path "secret/destroy/rook/*"  { capabilities = ["update"] }
"#;

/// KMS name of the test key.
const NAME: &str = "rook/osd-kek";

/// An OpenBao dev server with the `keyplan` policy written.
fn server(tls: bool) -> Option<openbao::OpenBao> {
    let bao = if tls {
        openbao::OpenBao::start_tls()?
    } else {
        openbao::OpenBao::start()?
    };
    let out = bao.cli_as(
        &bao.root_token,
        &["policy", "write", "keyplan", "-"],
        POLICY.as_bytes(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(bao)
}

/// A plan with the vault KMS at `addr` (`extra`: more YAML under the instance, indented by
/// four spaces), key `osd` (`rook/osd-kek`, rotated every 90 days) on the device `a.img`.
fn plan(addr: &str, extra: &str) -> String {
    format!(
        "version: 1\nkms:\n  vault:\n    provider: vault\n    address: {addr}\n{extra}keys:\n  osd: {{ kms: vault, name: {NAME}, rotate_after: 90d }}\ndevices:\n  a: {{ path: a.img, keys: [osd], enroll_with: initial.pass }}\n{FAST_PBKDF}"
    )
}

/// `bao ARGS` as root; stdout trimmed.
fn bao_text(bao: &openbao::OpenBao, args: &[&str]) -> String {
    String::from_utf8(bao.cli(args))
        .expect("utf-8")
        .trim()
        .to_string()
}

/// Runs keyplan in `s` with only `env` added (no `VAULT_TOKEN` from the test's environment).
fn run(s: &Scratch, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = keyplan_command();
    cmd.current_dir(s.dir.path())
        .env("NO_COLOR", "1")
        .env_remove("VAULT_TOKEN")
        .env_remove("KEYPLAN_CRYPTSETUP")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run keyplan");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Like [`run`], asserting exit status `code`; stdout + stderr.
fn ok(s: &Scratch, args: &[&str], env: &[(&str, &str)], code: i32) -> String {
    let (got, out, err) = run(s, args, env);
    assert_eq!(got, Some(code), "keyplan {args:?}:\n{out}{err}");
    format!("{out}{err}")
}

/// Enrolls the device through the plan in `s`, then checks the KV value opens it.
fn enroll_and_check(s: &Scratch, bao: &openbao::OpenBao, a: &Path, env: &[(&str, &str)]) {
    let out = ok(s, &["apply", "--auto-approve"], env, 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let v1 = bao.kv_field(NAME, "osd-kek").expect("the KEK in KV");
    assert!(opens(a, &v1, None), "the KEK in Vault opens the device");
    let out = ok(s, &["plan", "--detailed-exitcode"], env, 0);
    assert!(out.contains("No changes"), "{out}");
}

/// `status --format json` (exit `code`) as JSON.
fn status_json(s: &Scratch, env: &[(&str, &str)], code: i32) -> serde_json::Value {
    let (got, out, err) = run(s, &["status", "--format", "json"], env);
    assert_eq!(got, Some(code), "status:\n{out}{err}");
    serde_json::from_str(&out).expect("status JSON")
}

/// Enables AppRole with the role `keyplan` (policy `keyplan`, token TTL 1 h, at most 4 h) and
/// returns its role ID.
fn approle_role(bao: &openbao::OpenBao) -> String {
    bao.cli(&["auth", "enable", "approle"]);
    bao.cli(&[
        "write",
        "auth/approle/role/keyplan",
        "token_policies=keyplan",
        "token_ttl=1h",
        "token_max_ttl=4h",
    ]);
    bao_text(
        bao,
        &[
            "read",
            "-field=role_id",
            "auth/approle/role/keyplan/role-id",
        ],
    )
}

#[test]
fn approle_login_with_the_secret_id_from_a_file_or_a_variable() {
    let Some(bao) = server(false) else {
        return;
    };
    let role_id = approle_role(&bao);
    let secret_id = bao_text(
        &bao,
        &[
            "write",
            "-f",
            "-field=secret_id",
            "auth/approle/role/keyplan/secret-id",
        ],
    );
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    s.initial_pass();
    std::fs::write(s.path("role-id"), format!("{role_id}\n")).expect("role id");
    std::fs::write(s.path("secret-id"), format!("{secret_id}\n")).expect("secret id");
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: approle, role_id_file: role-id, secret_id_file: secret-id }\n",
        ),
    );
    enroll_and_check(&s, &bao, &a, &[]);

    let live_tokens = || {
        let out = bao_text(&bao, &["list", "-format=json", "auth/token/accessors"]);
        serde_json::from_str::<Vec<String>>(&out)
            .expect("accessor list")
            .len()
    };
    let tokens_before = live_tokens();
    let j = status_json(&s, &[], 0);
    assert_eq!(
        live_tokens(),
        tokens_before,
        "the login token of the status run was revoked at its end"
    );
    let token = &j["kms"][0]["credentials"][0];
    assert_eq!(token["kind"], "vault_token", "{j:#}");
    assert!(
        token["what"].as_str().unwrap_or("").contains("AppRole"),
        "{token}"
    );
    assert!(
        token["renewed_by"]
            .as_str()
            .unwrap_or("")
            .contains("logs in again"),
        "{token}"
    );
    let now = j["generated_at"].as_u64().expect("generated_at");
    let expires = token["expires_at"]
        .as_u64()
        .expect("a login token has a TTL");
    assert!(
        expires > now + 3000 && expires <= now + 3700,
        "token_ttl 1h: {expires} vs {now}"
    );
    assert_eq!(token["expiring"], false, "a fresh login each run: {token}");

    // The same login with the secret ID from a variable and the role ID in the plan; a
    // rotation through it.
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            &format!("    auth: {{ method: approle, role_id: {role_id}, secret_id_env: KP_SECRET_ID }}\n"),
        ),
    );
    let env = [("KP_SECRET_ID", secret_id.as_str())];
    let old = bao.kv_field(NAME, "osd-kek").expect("v1");
    let out = ok(&s, &["apply", "--auto-approve", "--rotate", "osd"], &env, 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let new = bao.kv_field(NAME, "osd-kek").expect("v2");
    assert_ne!(new, old);
    assert!(opens(&a, &new, None) && !opens(&a, &old, None));
    assert!(
        !out.contains(secret_id.as_str()),
        "the secret ID is not shown: {out}"
    );
}

#[test]
fn approle_bad_input_names_the_kms_and_changes_nothing() {
    let Some(bao) = server(false) else {
        return;
    };
    let role_id = approle_role(&bao);
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    s.initial_pass();
    std::fs::write(s.path("role-id"), &role_id).expect("role id");
    let before = Snapshot::take(std::slice::from_ref(&a));

    // The secret ID file is missing.
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: approle, role_id_file: role-id, secret_id_file: no-such-file }\n",
        ),
    );
    for cmd in [&["plan"][..], &["apply", "--auto-approve"][..]] {
        let (code, out, err) = run(&s, cmd, &[]);
        assert_ne!(code, Some(0), "{out}{err}");
        assert!(
            err.contains("vault KMS \"vault\"")
                && err.contains("secret ID file")
                && err.contains("no-such-file"),
            "{cmd:?}: {err}"
        );
    }
    // A secret ID the role never issued.
    std::fs::write(s.path("secret-id"), "00000000-0000-0000-0000-000000000000").expect("write");
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: approle, role_id_file: role-id, secret_id_file: secret-id }\n",
        ),
    );
    // One refused login per run, whatever the run asks (servers lock a role out after a few).
    let (_, _, err) = run(&s, &["status"], &[("KEYPLAN_LOG", "debug")]);
    assert_eq!(
        err.matches("vault request: logging in with AppRole")
            .count(),
        1,
        "{err}"
    );
    let (code, out, err) = run(&s, &["apply", "--auto-approve"], &[]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("vault KMS \"vault\"")
            && err.contains("refused the login")
            && err.contains("AppRole mount \"approle\""),
        "{err}"
    );
    // Both the ID and its file: refused by validation, with the place in the plan.
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: approle, role_id: x, role_id_file: role-id, secret_id_env: X }\n",
        ),
    );
    let (code, out, err) = run(&s, &["plan"], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("keyplan::plan::vault_auth") && err.contains("keyplan.yaml:6:"),
        "{err}"
    );
    before.assert_unchanged("after refused logins");
    assert!(
        bao.kv_field(NAME, "osd-kek").is_none(),
        "nothing written to Vault"
    );
}

/// The audience keyplan's login tokens are minted for (the OpenBao role asks the API server to
/// check it in its TokenReview).
const AUDIENCE: &str = "openbao";

/// The claims (second part) of a JWT, decoded without checking anything.
fn jwt_claims(jwt: &str) -> serde_json::Value {
    let part = jwt.split('.').nth(1).expect("a JWT has claims");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .expect("base64url claims");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

/// `jwt` with its claims kept and its signature replaced: what only the API server (the issuer
/// of the signing key) can tell from the real token.
fn forged(jwt: &str) -> String {
    let mut parts: Vec<&str> = jwt.split('.').collect();
    let sig =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"not the cluster's signature");
    parts[2] = &sig;
    parts.join(".")
}

#[test]
fn kubernetes_login_with_a_service_account_token_checked_by_token_review() {
    let Some(bao) = server(false) else {
        return;
    };
    let Some(c) = kube::Cluster::get() else {
        return;
    };
    let ns = c.fresh_namespace("vault-auth");
    let other_ns = c.fresh_namespace("vault-auth-other");
    // The reviewer: a ServiceAccount allowed to create TokenReviews (system:auth-delegator),
    // whose token OpenBao sends with each review.
    c.service_account(&ns, "token-reviewer");
    c.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("keyplan-token-reviewer-{ns}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "system:auth-delegator"},
            "subjects": [{"kind": "ServiceAccount", "name": "token-reviewer",
                "namespace": ns}]}),
    );
    let reviewer_jwt = c.service_account_token(&ns, "token-reviewer", &[], None);
    // keyplan's identity, and two that the role does not bind: another ServiceAccount of the
    // namespace, and a `keyplan` of another namespace.
    for (n, sa) in [(&ns, "keyplan"), (&ns, "intruder"), (&other_ns, "keyplan")] {
        c.service_account(n, sa);
    }
    let jwt = c.service_account_token(&ns, "keyplan", &[AUDIENCE], None);
    let claims = jwt_claims(&jwt);
    let exp = claims["exp"].as_u64().expect("exp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(
        exp > now + 86_000 && exp <= now + 86_400 + 60,
        "TokenRequest for 24 h: {claims}"
    );

    bao.cli(&["auth", "enable", "kubernetes"]);
    let s = Scratch::new();
    let host = format!("kubernetes_host={}", c.url());
    let reviewer = format!("token_reviewer_jwt={reviewer_jwt}");
    let ca = format!("kubernetes_ca_cert=@{}", c.info.ca.display());
    bao.cli(&[
        "write",
        "auth/kubernetes/config",
        &host,
        &reviewer,
        &ca,
        "disable_local_ca_jwt=true",
    ]);
    let bound_ns = format!("bound_service_account_namespaces={ns}");
    let audience = format!("audience={AUDIENCE}");
    bao.cli(&[
        "write",
        "auth/kubernetes/role/keyplan",
        "bound_service_account_names=keyplan",
        &bound_ns,
        &audience,
        "token_policies=keyplan",
        "token_ttl=1h",
    ]);
    let a = s.small_image("a.img", "luks2");
    s.initial_pass();
    let jwt_file = s.path("sa-token");
    std::fs::write(&jwt_file, &jwt).expect("jwt");
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: kubernetes, role: keyplan, jwt_file: sa-token }\n",
        ),
    );
    enroll_and_check(&s, &bao, &a, &[]);

    let j = status_json(&s, &[], 1);
    let creds = j["kms"][0]["credentials"].as_array().expect("credentials");
    assert_eq!(creds.len(), 2, "{j:#}");
    assert_eq!(creds[0]["kind"], "vault_token");
    assert_eq!(creds[1]["kind"], "service_account_token");
    assert_eq!(creds[1]["expires_at"].as_u64(), Some(exp), "the JWT's exp");
    // Outside the projected path nobody refreshes the file: a day is before the next
    // rotation (90 days), so status warns.
    assert_eq!(creds[1]["expiring"], true, "{j:#}");

    // A role the server does not know: refused, naming the role and the mount.
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: kubernetes, role: nosuchrole, jwt_file: sa-token }\n",
        ),
    );
    let before = Snapshot::take(std::slice::from_ref(&a));
    let (code, out, err) = run(&s, &["apply", "--auto-approve", "--rotate", "osd"], &[]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("refused the login") && err.contains("role \"nosuchrole\""),
        "{err}"
    );
    before.assert_unchanged("after a refused Kubernetes login");
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: kubernetes, role: keyplan, jwt_file: sa-token }\n",
        ),
    );
    // Tokens the cluster does not vouch for, or vouches for as someone the role does not
    // bind: the real token's claims with another signature (only the API server's
    // TokenReview can tell), a token for another audience, and real tokens of another
    // ServiceAccount and of `keyplan` in another namespace.
    let refused = [
        ("a forged signature", forged(&jwt)),
        (
            "another audience",
            c.service_account_token(&ns, "keyplan", &["someone-else"], None),
        ),
        (
            "another service account",
            c.service_account_token(&ns, "intruder", &[AUDIENCE], None),
        ),
        (
            "another namespace",
            c.service_account_token(&other_ns, "keyplan", &[AUDIENCE], None),
        ),
    ];
    for (what, token) in &refused {
        std::fs::write(&jwt_file, token).expect("jwt");
        let (code, out, err) = run(&s, &["plan"], &[]);
        assert_ne!(code, Some(0), "{what}: {out}{err}");
        assert!(err.contains("refused the login"), "{what}: {err}");
    }
    before.assert_unchanged("after refused Kubernetes logins");
    // The real token still logs in: the refusals were about the tokens.
    std::fs::write(&jwt_file, &jwt).expect("jwt");
    let out = ok(&s, &["plan", "--detailed-exitcode"], &[], 0);
    assert!(out.contains("No changes"), "{out}");
}

#[test]
fn certificate_login_over_tls() {
    let Some(bao) = server(true) else {
        return;
    };
    let s = Scratch::new();
    let dir = s.dir.path();
    let ca_ext = [
        "basicConstraints=critical,CA:TRUE",
        "keyUsage=critical,keyCertSign,cRLSign",
    ];
    pykmip::make_cert_days(
        dir,
        "client-ca",
        "keyplan test client CA",
        None,
        &ca_ext,
        30,
    );
    let client_ext = ["extendedKeyUsage=clientAuth"];
    pykmip::make_cert_days(dir, "client", "keyplan", Some("client-ca"), &client_ext, 20);
    bao.cli(&["auth", "enable", "cert"]);
    let ca = format!("certificate=@{}", s.path("client-ca.crt").display());
    bao.cli(&[
        "write",
        "auth/cert/certs/keyplan",
        &ca,
        "token_policies=keyplan",
        "token_ttl=1h",
    ]);
    let a = s.small_image("a.img", "luks2");
    s.initial_pass();
    let server_ca = bao.ca_cert.as_ref().expect("TLS server CA");
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            &format!(
                "    ca_cert: {}\n    auth: {{ method: cert, name: keyplan, client_cert: client.crt, client_key: client.key }}\n",
                server_ca.display()
            ),
        ),
    );
    enroll_and_check(&s, &bao, &a, &[]);
    let j = status_json(&s, &[], 1);
    let creds = j["kms"][0]["credentials"].as_array().expect("credentials");
    assert_eq!(creds[1]["kind"], "client_certificate", "{j:#}");
    let now = j["generated_at"].as_u64().expect("generated_at");
    let not_after = creds[1]["expires_at"].as_u64().expect("notAfter");
    assert!(not_after > now + 19 * 86_400 && not_after <= now + 20 * 86_400 + 60);
    assert_eq!(
        creds[1]["expiring"], true,
        "20 days < 90 days + margin: {j:#}"
    );

    // A certificate role that does not exist: the server refuses the login (the role is sent
    // as `name`, so it restricts the login).
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            &format!(
                "    ca_cert: {}\n    auth: {{ method: cert, name: nosuch, client_cert: client.crt, client_key: client.key }}\n",
                server_ca.display()
            ),
        ),
    );
    let (code, out, err) = run(&s, &["plan"], &[]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("refused the login") && err.contains("certificate role nosuch"),
        "{err}"
    );

    // Certificate login over plain http is refused by validation.
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr.replace("https://", "http://"),
            "    auth: { method: cert, client_cert: client.crt, client_key: client.key }\n",
        ),
    );
    let out = ok(&s, &["plan"], &[], 1);
    assert!(out.contains("needs an `https://` address"), "{out}");
}

/// A renewable static token with little TTL left is renewed by `apply` (not by `plan` or
/// `status`); a token that is not renewable makes `status` warn; an expired token stops
/// everything with an error naming the variable.
#[test]
fn static_tokens_are_renewed_reported_and_refused_when_expired() {
    let Some(bao) = server(false) else {
        return;
    };
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    s.initial_pass();
    s.plan(
        "keyplan.yaml",
        &plan(
            &bao.addr,
            "    auth: { method: token, token_env: KP_TOKEN }\n",
        ),
    );
    let create = |extra: &[&str]| {
        let mut args = vec!["token", "create", "-policy=keyplan", "-field=token"];
        args.extend_from_slice(extra);
        bao_text(&bao, &args)
    };
    let ttl_of = |token: &str| -> (u64, bool) {
        let out = bao.cli_as(
            &bao.root_token,
            &["token", "lookup", "-format=json", token],
            b"",
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("lookup json");
        (
            j["data"]["ttl"].as_u64().expect("ttl"),
            !j["data"]["last_renewal_time"].is_null(),
        )
    };

    // Renewal: a 30 s renewable token with less than half left.
    let short = create(&["-ttl=30s", "-renewable=true"]);
    let env = [("KP_TOKEN", short.as_str())];
    enroll_and_check(&s, &bao, &a, &env);
    // The event is the server's own count: poll its lookup until less than half is left.
    let t0 = std::time::Instant::now();
    let (left, renewed) = loop {
        let (left, renewed) = ttl_of(&short);
        if left < 15 || renewed || t0.elapsed() > std::time::Duration::from_secs(60) {
            break (left, renewed);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert!(left < 15 && !renewed, "{left} s left before apply");
    ok(&s, &["plan"], &env, 0);
    assert!(!ttl_of(&short).1, "plan renews nothing");
    let out = ok(&s, &["apply", "--auto-approve"], &env, 0);
    let (left, renewed) = ttl_of(&short);
    assert!(
        renewed && left > 20,
        "apply renewed it: {left} s left\n{out}"
    );

    // A non-renewable token valid for 10 minutes: status warns (exit 1), with the gauge.
    let brief = create(&["-ttl=10m", "-renewable=false"]);
    let env = [("KP_TOKEN", brief.as_str())];
    let j = status_json(&s, &env, 1);
    let token = &j["kms"][0]["credentials"][0];
    assert_eq!(token["kind"], "vault_token");
    assert!(token["renewed_by"].is_null(), "{token}");
    assert_eq!(token["expiring"], true, "{j:#}");
    let problems = j["problems"].to_string();
    assert!(
        problems.contains("KMS vault: token from $KP_TOKEN expires at")
            && problems.contains("key osd"),
        "{problems}"
    );
    let text = ok(&s, &["status"], &env, 1);
    assert!(text.contains("EXPIRING"), "{text}");
    let prom = ok(&s, &["status", "--format", "prometheus"], &env, 1);
    assert!(
        prom.contains(r#"keyplan_kms_credential_expiring{kms="vault",credential="vault_token"} 1"#),
        "{prom}"
    );
    let out = ok(&s, &["plan"], &env, 0);
    assert!(
        out.contains("WARN") && out.contains("token from $KP_TOKEN"),
        "{out}"
    );

    // A revoked token: refused before anything is changed.
    bao.cli(&["token", "revoke", &brief]);
    let before = Snapshot::take(std::slice::from_ref(&a));
    let v1 = bao.kv_field(NAME, "osd-kek");
    let (code, out, err) = run(&s, &["apply", "--auto-approve", "--rotate", "osd"], &env);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("vault KMS \"vault\"")
            && err.contains("the token from $KP_TOKEN is invalid or expired"),
        "{err}"
    );
    before.assert_unchanged("after an expired token");
    assert_eq!(bao.kv_field(NAME, "osd-kek"), v1);
    assert!(
        !format!("{out}{err}").contains(&brief),
        "the token is not shown"
    );
}
