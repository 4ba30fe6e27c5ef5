//! The crash matrix of retire and destroy for every provider with a real server (issue 46):
//! OpenBao (vault), the real kube-apiserver (kubernetes, both layouts), PyKMIP (kmip), moto
//! (AWS Secrets Manager), the example exec helper `keyplan-kms-dir`, and the exec helper
//! `keyplan-kms-azure` against the Azure Key Vault stand-in (at the provider's points only:
//! it is slow, and no real server can be had).
//!
//! One driver, two scenarios, each on two small LUKS2 images and one key `k` (KMS name
//! `osd-kek`), each case continuing from the state the previous one converged to:
//!
//! - **retire**: `apply --rotate k` is killed (`SIGKILL`) at every hit of `kms.retire`,
//!   `kms.after_write` (inside the provider, after each of its writes) and `step.after_effect`.
//!   After each crash the KMS's current value, read with the server's own reader, opens every
//!   device (I1), and `status` reports the version being retired as lingering exactly when
//!   its record calls it retired and the server still has its material; a plain `apply`
//!   converges; the server hands out no material but the current and the previous version's
//!   (no retired version's); `status` reports nothing lingering.
//! - **destroy**: the key is moved from the provider to the file KMS, and that `apply` is
//!   killed at every hit of `kms.destroy_key`, `kms.after_write` and `step.after_effect`.
//!   After each crash `keyplan key get k` opens every device (I1); a plain `apply` converges;
//!   the provider's server hands out no material of the key at all; `status` reports nothing
//!   lingering (and, before the resume, reports lingering material only where the server
//!   has some). The key then moves back and is rotated, so that each destroy meets a current
//!   and a previous version.
//!
//! "Hands out" is the server's own reader over everything it keeps for the key: every KV
//! version of both paths (vault), every Secret of the namespace read as admin (kubernetes),
//! every object PyKMIP's client locates (kmip), every secret version that carries a label
//! (AWS: an unlabelled version is deprecated, and Secrets Manager deletes it at its own pace,
//! readable by version id until then: no API deletes one version, docs/kms/aws-secrets-manager.md),
//! every version file in the helper's directory (exec), every enabled version (Azure: a
//! retired one is disabled, and Key Vault refuses its value).

use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::time::Instant;

use crate::common::*;

/// One provider under test.
struct Provider<'a> {
    /// For messages: `vault`, `kubernetes`, ...
    name: &'static str,
    /// Its instance under `kms:`, named `p` (YAML indented two spaces, ending in a newline).
    kms_yaml: String,
    /// The environment keyplan needs to reach it.
    env: Vec<(String, String)>,
    /// The key's current value, as the server's own reader sees it.
    current: &'a dyn Fn() -> Option<Vec<u8>>,
    /// Whether `current` reads the current version at every instant, a killed run's
    /// included. Not so for Azure Key Vault, whose plain reader gets the secret's latest
    /// version: the pending one between a stage and its commit (docs/kms/azure-key-vault.md,
    /// "What other readers see"); I1 after a crash then reads the record, through
    /// `keyplan key get`.
    current_always: bool,
    /// Whether to crash at `step.after_effect` too (the engine's point between steps), not
    /// only at the provider's: false for a provider too slow for it (the Azure helper waits
    /// out a settle margin of a second or more at each write).
    step_points: bool,
    /// Every key material of `osd-kek` the server hands out, with where it is, read with the
    /// server's own reader.
    held: &'a dyn Fn() -> Vec<(String, Vec<u8>)>,
}

/// The matrix of one provider: its devices, its watch, and the runs.
struct Matrix<'a> {
    p: Provider<'a>,
    w: Watched,
    devs: Vec<PathBuf>,
}

impl<'a> Matrix<'a> {
    /// Two small LUKS2 images, the plan on KMS `p`, enrolled.
    fn new(p: Provider<'a>) -> Matrix<'a> {
        let w = Watched::new();
        w.s.initial_pass();
        let devs = vec![
            w.s.small_image("a.img", "luks2"),
            w.s.small_image("b.img", "luks2"),
        ];
        let m = Matrix { p, w, devs };
        m.plan("p");
        m.run(&["apply", "--auto-approve"], 0);
        m
    }

    /// Writes the plan with key `k` in KMS `kms` (`p` or the file KMS `local`).
    fn plan(&self, kms: &str) {
        self.w.s.plan(
            "keyplan.yaml",
            &format!(
                "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\n{}keys:\n  k: {{ kms: {kms}, name: osd-kek }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass }}\n  b: {{ path: b.img, keys: [k], enroll_with: initial.pass }}\n{FAST_PBKDF}",
                self.p.kms_yaml
            ),
        );
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = self.w.command(args);
        cmd.envs(self.p.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs keyplan, asserts exit code `code`; stdout and stderr as one text.
    fn run(&self, args: &[&str], code: i32) -> String {
        let out = self.command(args).output().expect("run keyplan");
        self.w.record(&out);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}: keyplan {args:?}:\n{text}",
            self.p.name
        );
        text
    }

    /// Runs keyplan with `point` firing (crash) at its hit `k + 1`: true when it was killed
    /// there, false when it finished (the point has fewer hits).
    fn crashed(&self, args: &[&str], point: &str, k: usize, when: &str) -> bool {
        let out = self
            .command(args)
            .env("FAILPOINTS", format!("{point}={k}*off->return"))
            .output()
            .expect("run keyplan");
        self.w.record(&out);
        if out.status.success() {
            return false;
        }
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{when}: not the injected crash: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        true
    }

    /// Panics unless `pass` opens every device.
    fn assert_opens(&self, pass: &[u8], when: &str) {
        self.w.add_secret(pass);
        for d in &self.devs {
            assert!(
                opens(d, pass, None),
                "{when}: I1: {} does not open",
                d.display()
            );
        }
    }

    /// The key's current value in the provider's server (remembered for the leak scan).
    fn current(&self, when: &str) -> Vec<u8> {
        let v = (self.p.current)().unwrap_or_else(|| panic!("{when}: no current value"));
        self.w.add_secret(&v);
        v
    }

    /// What `keyplan key get k` prints (not recorded: it is the key).
    fn key_get(&self, when: &str) -> Vec<u8> {
        let out = self
            .command(&["key", "get", "k"])
            .output()
            .expect("key get");
        assert!(
            out.status.success(),
            "{when}: key get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.w.add_secret(&out.stdout);
        out.stdout
    }

    /// `status --format json`: the report and its exit code.
    fn status(&self, when: &str) -> (serde_json::Value, Option<i32>) {
        let out = self
            .command(&["status", "--format", "json"])
            .output()
            .expect("status");
        self.w.record(&out);
        let j = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{when}: status JSON: {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (j, out.status.code())
    }

    /// A plain `apply` converges: `plan` then has no changes, and `status` reports no
    /// problem (nothing lingering) but the test servers' short-lived credentials (a
    /// kubeconfig token, a client certificate valid for days), and exits 0 without those.
    /// Returns the status report.
    fn converge(&self, when: &str) -> serde_json::Value {
        self.run(&["apply", "--auto-approve"], 0);
        let out = self.run(&["plan", "--detailed-exitcode"], 0);
        assert!(out.contains("No changes"), "{when}: {out}");
        let (j, code) = self.status(when);
        let (expiring, others): (Vec<&str>, Vec<&str>) = problems(&j)
            .into_iter()
            .partition(|p| p.contains("expires at") && p.contains("within"));
        assert!(others.is_empty(), "{when}: status: {others:?}");
        let want = if expiring.is_empty() { 0 } else { 1 };
        assert_eq!(code, Some(want), "{when}: status: {j}");
        j
    }

    /// The material the server holds besides `allowed`, by where it is.
    fn held_besides(&self, allowed: &[&[u8]]) -> Vec<String> {
        (self.p.held)()
            .into_iter()
            .filter(|(_, m)| {
                self.w.add_secret(m);
                !allowed.contains(&&m[..])
            })
            .map(|(at, _)| at)
            .collect()
    }
}

/// The problems a status report lists.
fn problems(j: &serde_json::Value) -> Vec<&str> {
    j["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str())
        .collect()
}

/// Whether status report `j` says KMS `kms` can still hand out material of version `v` (or
/// of any version: `None`) it records as retired (Kms::lingering).
fn reports_lingering(j: &serde_json::Value, kms: &str, v: Option<u64>) -> bool {
    problems(j).iter().any(|p| {
        p.contains(&format!("KMS {kms} records "))
            && p.contains("can still hand out")
            && v.is_none_or(|v| p.contains(&format!(" v{v} of")) || p.contains(&format!(" v{v},")))
    })
}

/// The one previous version status report `j` lists for key `k`.
fn previous_version(j: &serde_json::Value, when: &str) -> u64 {
    match versions(j).2[..] {
        [v] => v,
        _ => panic!("{when}: not one previous version: {j}"),
    }
}

/// Key `k`'s versions in status report `j`: current, pending, retained (previous).
fn versions(j: &serde_json::Value) -> (Option<u64>, Option<u64>, Vec<u64>) {
    let k = &j["keys"][0];
    (
        k["current"]["version"].as_u64(),
        k["pending"]["version"].as_u64(),
        k["retained"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_u64)
            .collect(),
    )
}

/// The retire scenario (module documentation); at least `min` crashes in all.
fn retire_matrix(p: Provider<'_>, min: usize) {
    let t0 = Instant::now();
    let name = p.name;
    let m = Matrix::new(p);
    // A second version, so that each rotation of the matrix retires one.
    let mut previous = m.current("setup");
    m.run(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let mut current = m.current("setup");
    assert_ne!(previous, current);
    // The version number of `previous`: the one the next rotation retires.
    let mut prev_ver = previous_version(&m.status("setup").0, "setup");
    let (mut per_point, mut lingering) = (Vec::new(), 0);
    let points = ["kms.retire", "kms.after_write", "step.after_effect"];
    for point in points
        .into_iter()
        .filter(|p| m.p.step_points || !p.starts_with("step."))
    {
        let mut hits = 0;
        for k in 0..60 {
            let when = format!("{name} retire: crash at {point} hit {}", k + 1);
            let crashed = m.crashed(
                &["apply", "--auto-approve", "--rotate", "k"],
                point,
                k,
                &when,
            );
            if crashed {
                hits += 1;
                let now = if m.p.current_always {
                    m.current(&when)
                } else {
                    m.key_get(&when)
                };
                m.assert_opens(&now, &when);
                // `status` before the resume reports the version being retired as lingering
                // exactly when its record calls it retired and the server still has it.
                let (j, _) = m.status(&when);
                let (cur, pending, retained) = versions(&j);
                let retired = cur != Some(prev_ver)
                    && pending != Some(prev_ver)
                    && !retained.contains(&prev_ver);
                let readable = (m.p.held)().iter().any(|(_, x)| *x == previous);
                lingering += usize::from(retired && readable);
                assert_eq!(
                    reports_lingering(&j, "p", Some(prev_ver)),
                    retired && readable,
                    "{when}: status before the resume; v{prev_ver} recorded retired: {retired}, its material readable in the server: {readable}: {j}"
                );
            }
            let j = m.converge(&when);
            let now = m.current(&when);
            m.assert_opens(&now, &format!("{when}, after recovery"));
            if now != current {
                previous = std::mem::replace(&mut current, now);
                prev_ver = previous_version(&j, &when);
            }
            let left = m.held_besides(&[&current, &previous]);
            assert!(
                left.is_empty(),
                "{when}, after recovery: the server still hands out material of a retired version: {left:?}"
            );
            if !crashed {
                break;
            }
        }
        per_point.push((point, hits));
    }
    let cases: usize = per_point.iter().map(|(_, h)| h).sum();
    eprintln!(
        "{name} retire matrix: {cases} crashes {per_point:?} ({lingering} reported lingering before the resume) in {:?}",
        t0.elapsed()
    );
    assert!(per_point.iter().all(|(_, h)| *h > 0), "{per_point:?}");
    assert!(cases >= min, "{per_point:?}");
    m.w.assert_no_leaks();
}

/// The destroy scenario (module documentation); at least `min` crashes in all.
fn destroy_matrix(p: Provider<'_>, min: usize) {
    let t0 = Instant::now();
    let name = p.name;
    let m = Matrix::new(p);
    // The provider holds two versions (current and previous) at each destroy.
    m.run(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let (mut per_point, mut lingering) = (Vec::new(), 0);
    let points = ["kms.destroy_key", "kms.after_write", "step.after_effect"];
    for point in points
        .into_iter()
        .filter(|p| m.p.step_points || !p.starts_with("step."))
    {
        let mut hits = 0;
        for k in 0..60 {
            let when = format!("{name} destroy: crash at {point} hit {}", k + 1);
            let value = m.current(&when);
            m.plan("local");
            let crashed = m.crashed(&["apply", "--auto-approve"], point, k, &when);
            if crashed {
                hits += 1;
                let got = m.key_get(&when);
                m.assert_opens(&got, &when);
                // `status` before the resume reports material left in the provider only
                // where there is some (whether the provider's record already calls the key
                // destroyed is the provider's business; the resume must finish it either way).
                let (j, _) = m.status(&when);
                if reports_lingering(&j, "p", None) {
                    assert!(
                        !(m.p.held)().is_empty(),
                        "{when}: status reports material the server no longer has: {j}"
                    );
                    lingering += 1;
                }
            }
            m.converge(&when);
            assert_eq!(m.key_get(&when), value, "{when}: the key moved unchanged");
            let left = m.held_besides(&[]);
            assert!(
                left.is_empty(),
                "{when}, after recovery: the server still hands out material of the moved key: {left:?}"
            );
            // Back to the provider for the next case.
            m.plan("p");
            m.converge(&format!("{when}, moved back"));
            assert_eq!(m.current(&when), value, "{when}: moved back unchanged");
            m.run(&["apply", "--auto-approve", "--rotate", "k"], 0);
            if !crashed {
                break;
            }
        }
        per_point.push((point, hits));
    }
    let cases: usize = per_point.iter().map(|(_, h)| h).sum();
    eprintln!(
        "{name} destroy matrix: {cases} crashes {per_point:?} ({lingering} reported lingering before the resume) in {:?}",
        t0.elapsed()
    );
    assert!(per_point.iter().all(|(_, h)| *h > 0), "{per_point:?}");
    assert!(cases >= min, "{per_point:?}");
    m.w.assert_no_leaks();
}

// --- vault (OpenBao) ---

/// Every KV version of `osd-kek` and its pending sibling that still has data, with the
/// values of its fields other than keyplan's own (`bao kv` as root); a version deleted but
/// not destroyed (recoverable with `kv undelete`) counts as material, named so.
fn vault_held(bao: &crate::common::openbao::OpenBao) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for path in ["osd-kek", "osd-kek.keyplan-pending"] {
        let Some(meta) = bao.kv_metadata(path) else {
            continue;
        };
        let versions = meta["versions"].as_object().cloned().unwrap_or_default();
        for (v, info) in versions {
            if info["destroyed"] == true {
                continue;
            }
            let kv: u64 = v.parse().expect("KV version number");
            if info["deletion_time"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
            {
                out.push((
                    format!("{path} KV v{kv} (deleted, not destroyed)"),
                    Vec::new(),
                ));
                continue;
            }
            let Some(data) = bao.kv_data(path, Some(kv)) else {
                continue;
            };
            for (field, value) in data.as_object().into_iter().flatten() {
                let text = value.as_str().unwrap_or_default();
                if !field.starts_with("keyplan_") && !text.is_empty() {
                    out.push((format!("{path} KV v{kv} {field}"), text.as_bytes().to_vec()));
                }
            }
        }
    }
    out
}

fn vault_provider<'a>(
    bao: &crate::common::openbao::OpenBao,
    current: &'a dyn Fn() -> Option<Vec<u8>>,
    held: &'a dyn Fn() -> Vec<(String, Vec<u8>)>,
) -> Provider<'a> {
    Provider {
        name: "vault",
        kms_yaml: format!(
            "  p: {{ provider: vault, address: \"{}\", mount: secret }}\n",
            bao.addr
        ),
        env: vec![("VAULT_TOKEN".into(), bao.root_token.clone())],
        current,
        current_always: true,
        step_points: true,
        held,
    }
}

#[test]
fn vault_retire() {
    let Some(bao) = crate::common::openbao::OpenBao::start() else {
        return;
    };
    let current = || bao.kv_field("osd-kek", "osd-kek");
    let held = || vault_held(&bao);
    retire_matrix(vault_provider(&bao, &current, &held), 8);
}

#[test]
fn vault_destroy() {
    let Some(bao) = crate::common::openbao::OpenBao::start() else {
        return;
    };
    let current = || bao.kv_field("osd-kek", "osd-kek");
    let held = || vault_held(&bao);
    destroy_matrix(vault_provider(&bao, &current, &held), 4);
}

// --- kubernetes (real kube-apiserver) ---

/// Every non-empty `data` value of every Secret of the key in namespace `ns`, read as admin.
fn kube_held(kube: &crate::common::kube::Cluster, ns: &str) -> Vec<(String, Vec<u8>)> {
    use base64::Engine as _;
    let mut out = Vec::new();
    for s in kube.objects("secrets", ns) {
        let name = s["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !name.starts_with("osd-kek") {
            continue;
        }
        for (field, v) in s["data"].as_object().into_iter().flatten() {
            let b = v
                .as_str()
                .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
                .unwrap_or_default();
            if !b.is_empty() {
                out.push((format!("Secret {name} data {field}"), b));
            }
        }
    }
    out
}

/// The kubernetes matrix in a fresh namespace; `per_version`: in the secret-per-version
/// layout (an index Secret naming the layout exists before the key is created).
fn kube_matrix(prefix: &str, destroy: bool, per_version: bool) {
    let Some(kube) = crate::common::kube::Cluster::get() else {
        return;
    };
    let ns = kube.fresh_namespace(prefix);
    let kubeconfig = kube.kubeconfig(&ns, "full");
    if per_version {
        kube.put_secret(
            &ns,
            serde_json::json!({"metadata": {"name": "osd-kek-keyplan",
                "annotations": {"keyplan.io/layout": "secret-per-version"}}}),
        );
    }
    // The index names the Secret holding the current version (secret-per-version layout).
    let current = || {
        let secret = if per_version {
            kube.annotation(&ns, "osd-kek-keyplan", "keyplan.io/current-secret")?
        } else {
            "osd-kek".to_string()
        };
        kube.data(&ns, &secret, "dmcrypt-key")
    };
    let held = || kube_held(kube, &ns);
    let p = Provider {
        name: if per_version {
            "kubernetes (secret per version)"
        } else {
            "kubernetes"
        },
        kms_yaml: format!("  p: {{ provider: kubernetes, namespace: {ns} }}\n"),
        env: vec![("KUBECONFIG".into(), kubeconfig.display().to_string())],
        current: &current,
        current_always: true,
        step_points: true,
        held: &held,
    };
    if destroy {
        destroy_matrix(p, 4);
    } else {
        retire_matrix(p, 8);
    }
}

#[test]
fn kubernetes_retire() {
    kube_matrix("crash-retire", false, false);
}

#[test]
fn kubernetes_destroy() {
    kube_matrix("crash-destroy", true, false);
}

#[test]
fn kubernetes_secret_per_version_retire() {
    kube_matrix("crash-retire-spv", false, true);
}

#[test]
fn kubernetes_secret_per_version_destroy() {
    kube_matrix("crash-destroy-spv", true, true);
}

// --- kmip (PyKMIP) ---

/// The number N of an object named `osd-kek/v<N>`.
fn kmip_version(o: &crate::common::pykmip::PyObject) -> Option<u64> {
    o.names
        .iter()
        .find_map(|n| n.strip_prefix("osd-kek/v").and_then(|v| v.parse().ok()))
}

fn kmip_matrix(destroy: bool) {
    use crate::common::pykmip::PyKmip;
    let Some(server) = PyKmip::start() else {
        return;
    };
    // The key's version objects (not its holder records), as PyKMIP's client sees them.
    let versions = || {
        server
            .objects()
            .into_iter()
            .filter(|o| o.groups.iter().all(|g| !g.starts_with("keyplan-holders:")))
            .filter(|o| kmip_version(o).is_some())
            .collect::<Vec<_>>()
    };
    // The Active object of the highest version (after a commit killed before the old current
    // was revoked, two are Active: the newer is current).
    let current = || {
        versions()
            .into_iter()
            .filter(|o| o.state == "ACTIVE")
            .max_by_key(kmip_version)
            .map(|o| o.bytes())
    };
    let held = || {
        versions()
            .into_iter()
            .map(|o| (format!("{:?} {} ({})", o.names, o.uid, o.state), o.bytes()))
            .collect()
    };
    // A client certificate far from expiry: `status` would report the default one (2 days).
    crate::common::pykmip::make_cert_days(
        &server.file(""),
        "long",
        "keyplan",
        Some("ca"),
        &["extendedKeyUsage=clientAuth", "basicConstraints=CA:FALSE"],
        400,
    );
    let p = Provider {
        name: "kmip",
        kms_yaml: server.kms_yaml_with(
            "p",
            &server.file("ca.crt"),
            &server.file("long.crt"),
            &server.file("long.key"),
        ),
        env: Vec::new(),
        current: &current,
        current_always: true,
        step_points: true,
        held: &held,
    };
    if destroy {
        destroy_matrix(p, 4);
    } else {
        retire_matrix(p, 8);
    }
}

#[test]
fn kmip_retire() {
    kmip_matrix(false);
}

#[test]
fn kmip_destroy() {
    kmip_matrix(true);
}

// --- AWS Secrets Manager (moto) ---

fn aws_matrix(destroy: bool) {
    use crate::common::moto::Moto;
    let Some(server) = Moto::start() else {
        return;
    };
    let current = || server.get("osd-kek", None).map(String::into_bytes);
    // Every labelled version (see the module documentation for the unlabelled ones).
    let held = || {
        server
            .labelled("osd-kek")
            .into_iter()
            .map(|(id, labels, v)| (format!("version {id} {labels:?}"), v.into_bytes()))
            .collect()
    };
    let p = Provider {
        name: "aws",
        kms_yaml: server.kms_yaml("p", ""),
        env: server
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        current: &current,
        current_always: true,
        step_points: true,
        held: &held,
    };
    if destroy {
        destroy_matrix(p, 4);
    } else {
        retire_matrix(p, 8);
    }
}

#[test]
fn aws_retire() {
    aws_matrix(false);
}

#[test]
fn aws_destroy() {
    aws_matrix(true);
}

// --- exec (the example helper keyplan-kms-dir) ---

fn exec_matrix(destroy: bool) {
    use crate::common::standin::{python, python_available};
    if !python_available("the exec crash matrix") {
        return;
    }
    // Outside the watched scratch directory: the helper's files hold the material.
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = dir.path().join("keys");
    let key_dir = keys.join("osd-kek");
    let current = || {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(key_dir.join("meta.json")).ok()?).ok()?;
        let n = meta["current"].as_u64()?;
        std::fs::read(key_dir.join(format!("v{n}.key"))).ok()
    };
    let held = || {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&key_dir).into_iter().flatten().flatten() {
            let f = e.file_name().to_string_lossy().to_string();
            if f.ends_with(".key") {
                out.push((f, std::fs::read(e.path()).expect("read version file")));
            }
        }
        out
    };
    let argv = serde_json::to_string(&[
        python(),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/exec-kms/keyplan-kms-dir"
        )
        .to_string(),
        keys.display().to_string(),
    ])
    .expect("argv");
    let p = Provider {
        name: "exec",
        kms_yaml: format!("  p: {{ provider: exec, command: {argv} }}\n"),
        env: Vec::new(),
        current: &current,
        current_always: true,
        step_points: true,
        held: &held,
    };
    if destroy {
        destroy_matrix(p, 4);
    } else {
        retire_matrix(p, 8);
    }
}

#[test]
fn exec_retire() {
    exec_matrix(false);
}

#[test]
fn exec_destroy() {
    exec_matrix(true);
}

// --- exec: the Azure Key Vault helper against its stand-in ---

fn azure_matrix(destroy: bool) {
    use crate::common::azure::{AzureVault, CLIENT_SECRET};
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let helper = vault.helper_script(dir.path(), "kms-azure", "", CLIENT_SECRET);
    let current = || vault.get("osd-kek", None).ok().map(String::into_bytes);
    // Every enabled version: Key Vault deletes no single version, a retired one is disabled
    // (its value no longer readable).
    let held = || {
        vault
            .versions("osd-kek")
            .into_iter()
            .filter(|v| v.enabled)
            .filter_map(|v| {
                let value = vault.get("osd-kek", Some(&v.id)).ok()?;
                Some((format!("version {} (enabled)", v.id), value.into_bytes()))
            })
            .collect()
    };
    let p = Provider {
        name: "exec (azure)",
        kms_yaml: format!(
            "  p: {{ provider: exec, command: [\"{}\"] }}\n",
            helper.display()
        ),
        env: Vec::new(),
        current: &current,
        current_always: false,
        step_points: false,
        held: &held,
    };
    if destroy {
        destroy_matrix(p, 2);
    } else {
        retire_matrix(p, 3);
    }
}

#[test]
fn exec_azure_retire() {
    azure_matrix(false);
}

#[test]
fn exec_azure_destroy() {
    azure_matrix(true);
}

/// Found by running this matrix with `return(error)` instead of crashes: a retire that fails
/// (the KMS unreachable at that moment; here the file KMS, `kms.retire=return(error)`) was not
/// retried. The failed run has an end record, so the next `apply` plans afresh instead of
/// resuming it, and a plan retired old versions only when it rotated: `plan` said "No
/// changes", the version stayed `previous` with its material readable, and `status` kept
/// reporting the failed run ("`keyplan apply` finishes or retries it") until the next
/// rotation. Now a plan retires such a leftover (src/diff/decide/retention.rs).
#[test]
fn a_retire_that_failed_is_finished_by_the_next_apply() {
    let w = Watched::new();
    w.s.initial_pass();
    for d in ["a.img", "b.img"] {
        w.s.small_image(d, "luks2");
    }
    w.s.plan(
        "keyplan.yaml",
        &format!("version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local, name: osd-kek }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass }}\n  b: {{ path: b.img, keys: [k], enroll_with: initial.pass }}\n{FAST_PBKDF}"),
    );
    w.ok(&["apply", "--auto-approve"], 0);
    w.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let out = w
        .command(&["apply", "--auto-approve", "--rotate", "k"])
        .env("FAILPOINTS", "kms.retire=return(error)")
        .output()
        .expect("run keyplan");
    w.record(&out);
    assert_eq!(out.status.code(), Some(1), "the retire of v1 failed");
    assert!(w.s.path("keys/osd-kek/v1.key").exists());

    let out = w.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        out.contains("v1"),
        "the retire of v1 is planned again: {out}"
    );
    w.ok(&["apply", "--auto-approve"], 0);
    assert!(
        !w.s.path("keys/osd-kek/v1.key").exists(),
        "v1's material is still readable"
    );
    w.ok(&["status"], 0);
    w.assert_no_leaks();
}
