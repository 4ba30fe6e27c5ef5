//! Operator comfort: apply's progress (plain lines when piped, spinners on a terminal), the
//! JSON log format, colour (`--color`, NO_COLOR), shell completions, the man page, and the
//! CI and systemd examples. Terminals are real pseudo-terminals (`script(1)`); apply runs the
//! real cryptsetup on LUKS image files.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;

/// A keyplan command in `dir` with no NO_COLOR in its environment.
fn bare(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = keyplan_command();
    cmd.current_dir(dir)
        .env_remove("NO_COLOR")
        .env_remove("KEYPLAN_LOG")
        .args(args);
    cmd
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `shell_cmd` under a pseudo-terminal (`script -qfec`) in `dir` with `env`; returns what
/// the terminal showed and the exit status. None when `script` is not installed.
fn in_pty(dir: &Path, shell_cmd: &str, env: &[(&str, &str)]) -> Option<(String, i32)> {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("script(1) not installed: skipping the terminal check");
        return None;
    }
    let mut cmd = Command::new("script");
    cmd.current_dir(dir)
        .args(["-qfec", shell_cmd, "/dev/null"])
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .env_remove("KEYPLAN_LOG")
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run script");
    Some((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().unwrap_or(-1),
    ))
}

/// Two LUKS2 devices enrolled through `initial.pass` with key `k`.
fn two_devices(s: &Scratch) {
    s.initial_pass();
    s.image("a.img", "luks2");
    s.image("b.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }"),
    );
}

/// `[done/total] step: outcome (1.2s)` lines, one per finished step, numbered 1..=total in
/// completion order; the run's result is real (both devices open with the KMS's key).
#[test]
fn apply_prints_one_numbered_timed_line_per_step_when_piped() {
    let s = Scratch::new();
    two_devices(&s);
    let out = s.ok(&["apply", "--auto-approve"], 0);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("  [")).collect();
    // stage, per device add + verify, commit
    assert_eq!(lines.len(), 6, "{out}");
    for (i, l) in lines.iter().enumerate() {
        let prefix = format!("  [{}/6] ", i + 1);
        assert!(l.starts_with(&prefix), "{l}");
        let (_, tail) = l.rsplit_once(" (").expect("elapsed");
        let secs = tail
            .strip_suffix("s)")
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("elapsed time at the end of {l:?}"));
        assert!((0.0..60.0).contains(&secs), "{l}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("a: add k new version into keyslot 1")
                && l.contains(": added keyslot 1 (k v1) (")),
        "{out}"
    );
    assert!(lines.iter().any(|l| l.contains("b: verify k")), "{out}");
    assert!(out.contains("\nApply complete! 2 added"), "{out}");
    assert!(
        !out.contains('\u{1b}'),
        "escape codes in piped output: {out}"
    );
    let key = s.key_get("k", None);
    assert!(opens(&s.path("a.img"), &key, Some(1)));
    assert!(opens(&s.path("b.img"), &key, Some(1)));

    // --quiet: no step lines.
    let out = s.ok(&["apply", "--auto-approve", "--rotate", "k", "-q"], 0);
    assert!(!out.contains("  ["), "{out}");
    assert!(out.contains("Apply complete! 2 added, 2 removed, 1 keys rotated"));
}

/// On a terminal: a spinner line per running step (device and step) under a steps-done bar,
/// then the summary. cryptsetup is slowed down so that each step is drawn while it runs.
#[test]
fn apply_on_a_terminal_shows_spinners_and_the_summary() {
    let s = Scratch::new();
    two_devices(&s);
    let real = real_cryptsetup();
    let slow = script(
        s.dir.path(),
        "slow-cryptsetup",
        &format!("#!/bin/sh\nsleep 0.4\nexec '{}' \"$@\"\n", real.display()),
    );
    let cmd = format!("'{}' apply --auto-approve", keyplan_bin().display());
    let Some((screen, code)) = in_pty(
        s.dir.path(),
        &cmd,
        &[("KEYPLAN_CRYPTSETUP", slow.to_str().unwrap())],
    ) else {
        return;
    };
    assert_eq!(code, 0, "{screen}");
    // The bar: `[====>   ] 3/6 steps, 1s`.
    assert!(screen.contains("/6 steps, "), "{screen}");
    // A spinner while `a`'s add runs: the step with its elapsed time, e.g. `⠁ a: add ... (0s)`;
    // the finished line of the same step ends with the outcome instead.
    let running = "a: add k new version into keyslot 1 (unlock with the enroll_with passphrase) (";
    assert!(screen.contains(running), "{screen}");
    assert!(screen.contains("] 6/6 steps"), "{screen}");
    assert!(
        screen.contains("Apply complete! 2 added, 0 removed, 0 keys rotated."),
        "{screen}"
    );
    // Cursor movement: the display redraws in place.
    assert!(screen.contains("\u{1b}[2K"), "{screen}");
    assert!(opens(&s.path("b.img"), &s.key_get("k", None), Some(1)));
}

/// `-v --log-format json`: every stderr line is one JSON object with a level and fields; no key
/// material anywhere (logs at trace level, via the leak scanner).
#[test]
fn json_logs_are_one_object_per_line_without_secrets() {
    let w = Watched::new();
    w.s.initial_pass();
    w.s.image("d.img", "luks2");
    w.s.plan(
        "keyplan.yaml",
        &one_key_plan("  d: { path: d.img, keys: [k], enroll_with: initial.pass }"),
    );
    for args in [
        &["-v", "--log-format", "json", "apply", "--auto-approve"][..],
        &[
            "-v",
            "--log-format",
            "json",
            "apply",
            "--auto-approve",
            "--rotate",
            "k",
        ][..],
    ] {
        let out = w.run(args);
        assert_eq!(out.status.code(), Some(0));
        let (stdout, stderr) = text(&out);
        assert!(stdout.contains("Apply complete!"), "{stdout}");
        let mut levels = std::collections::BTreeSet::new();
        let mut n = 0;
        for line in stderr.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object: {line:?}: {e}"));
            let level = v["level"].as_str().expect("level");
            levels.insert(level.to_string());
            assert!(v["timestamp"].is_string(), "{line}");
            assert!(v["fields"]["message"].is_string(), "{line}");
            n += 1;
        }
        assert!(n > 5, "{stderr}");
        assert!(levels.contains("INFO"), "{levels:?}");
        // The executor's structured fields survive as JSON fields.
        assert!(
            stderr.lines().any(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["fields"]["step"].is_u64() && v["fields"]["run"].is_string()
            }),
            "{stderr}"
        );
    }
    assert!(w.wrapper_saw_calls());
    w.assert_no_leaks();
}

/// `--log-format` is checked: a wrong value names the choices and changes nothing.
#[test]
fn log_format_rejects_unknown_values() {
    let s = Scratch::new();
    let out = s.keyplan(&["--log-format", "xml", "validate"]);
    assert_eq!(out.status.code(), Some(1), "a usage error exits 1");
    let (_, err) = text(&out);
    assert!(err.contains("text") && err.contains("json"), "{err}");
}

fn colour_scratch() -> Scratch {
    let s = Scratch::new();
    s.initial_pass();
    s.image("d.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  d: { path: d.img, keys: [k], enroll_with: initial.pass }"),
    );
    s
}

const GREEN: &str = "\u{1b}[32m";
const BOLD: &str = "\u{1b}[1m";

/// Plan text colour: `--color always` colours a pipe (and wins over NO_COLOR), NO_COLOR and
/// `--color never` and a plain pipe get none.
#[test]
fn plan_colours_follow_color_flag_and_no_color() {
    let s = colour_scratch();
    let run = |args: &[&str], no_color: Option<&str>| {
        let mut cmd = bare(s.dir.path(), args);
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = cmd.output().expect("run");
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
        text(&out).0
    };
    let always = run(&["plan", "--color", "always"], None);
    assert!(
        always.contains(&format!("{GREEN}  + keyslot 1  k v1")),
        "{always:?}"
    );
    assert!(
        always.contains(&format!("{BOLD}Plan: 1 to add")),
        "{always:?}"
    );
    // Same words once the escapes are gone.
    let plain = run(&["plan"], None);
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
    assert_eq!(
        always
            .replace(GREEN, "")
            .replace(BOLD, "")
            .replace("\u{1b}[0m", ""),
        plain
    );
    assert!(!run(&["plan", "--color", "never"], None).contains('\u{1b}'));
    assert!(!run(&["plan"], Some("1")).contains('\u{1b}'));
    // Explicit --color always overrides NO_COLOR (documented choice, as no-color.org asks of
    // per-invocation options).
    assert!(run(&["plan", "--color", "always"], Some("1")).contains(GREEN));
}

/// On a terminal, `auto` colours; NO_COLOR=1 or an explicit `never` do not; an empty NO_COLOR
/// does not disable colour (no-color.org).
#[test]
fn plan_colours_a_terminal_unless_no_color() {
    let s = colour_scratch();
    let k = keyplan_bin();
    let cmd = format!("'{}' plan", k.display());
    let Some((screen, code)) = in_pty(s.dir.path(), &cmd, &[]) else {
        return;
    };
    assert_eq!(code, 0, "{screen}");
    assert!(screen.contains(GREEN), "{screen:?}");
    let (screen, _) = in_pty(s.dir.path(), &cmd, &[("NO_COLOR", "1")]).unwrap();
    assert!(screen.contains("+ keyslot 1"), "{screen:?}");
    assert!(!screen.contains(GREEN), "{screen:?}");
    let (screen, _) = in_pty(s.dir.path(), &cmd, &[("NO_COLOR", "")]).unwrap();
    assert!(screen.contains(GREEN), "{screen:?}");
    let never = format!("'{}' --color never plan", k.display());
    let (screen, _) = in_pty(s.dir.path(), &never, &[]).unwrap();
    assert!(!screen.contains(GREEN), "{screen:?}");
}

/// Bash completion names the subcommands and flags and is valid bash; the other shells produce
/// their scripts.
#[test]
fn completions_cover_subcommands_and_parse() {
    let s = Scratch::new();
    let bash = s.ok(&["completions", "bash"], 0);
    for word in [
        "validate",
        "plan",
        "apply",
        "status",
        "journal",
        "completions",
        "--detailed-exitcode",
        "--auto-approve",
        "--log-format",
    ] {
        assert!(
            bash.contains(word),
            "{word} missing from the bash completion"
        );
    }
    let f = s.path("keyplan.bash");
    std::fs::write(&f, &bash).unwrap();
    let check = Command::new("bash")
        .arg("-n")
        .arg(&f)
        .output()
        .expect("bash");
    assert!(check.status.success(), "{}", text(&check).1);
    // Loaded into bash, it registers a completion for `keyplan`.
    let loaded = Command::new("bash")
        .arg("-c")
        .arg(format!("source '{}' && complete -p keyplan", f.display()))
        .output()
        .expect("bash");
    assert!(
        String::from_utf8_lossy(&loaded.stdout).contains("keyplan"),
        "{:?}",
        text(&loaded)
    );
    for (shell, marker) in [
        ("zsh", "#compdef keyplan"),
        ("fish", "complete -c keyplan"),
        ("elvish", "keyplan"),
        ("powershell", "keyplan"),
    ] {
        let out = s.ok(&["completions", shell], 0);
        assert!(out.contains(marker), "{shell}: {out}");
    }
    let out = s.keyplan(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(1), "a usage error exits 1");
}

/// `keyplan man`: roff with a `.TH` header naming the options; `--out-dir` writes one page per
/// command; `man -l` renders them when man is installed.
#[test]
fn man_page_is_roff_and_renders() {
    let s = Scratch::new();
    let page = s.ok(&["man"], 0);
    assert!(
        page.lines().any(|l| l.starts_with(".TH keyplan 1")),
        "{page}"
    );
    for opt in ["\\-\\-state\\-dir", "\\-\\-log\\-format", "\\-\\-color"] {
        assert!(page.contains(opt), "{opt} missing");
    }
    assert!(page.contains("keyplan\\-apply(1)"), "subcommands listed");
    let dir = s.path("man");
    let listed = s.ok(&["man", "--out-dir", dir.to_str().unwrap()], 0);
    for name in [
        "keyplan.1",
        "keyplan-plan.1",
        "keyplan-apply.1",
        "keyplan-key-get.1",
    ] {
        let p = dir.join(name);
        assert!(p.is_file(), "{name}: {listed}");
        assert!(listed.contains(p.to_str().unwrap()), "{listed}");
    }
    let plan_page = std::fs::read_to_string(dir.join("keyplan-plan.1")).unwrap();
    assert!(
        plan_page.contains("\\-\\-detailed\\-exitcode"),
        "{plan_page}"
    );
    if Command::new("man").arg("--version").output().is_err() {
        eprintln!("man not installed: skipping the rendering check");
        return;
    }
    let out = Command::new("man")
        .arg("-l")
        .arg(dir.join("keyplan-plan.1"))
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "80")
        .output()
        .expect("man");
    let (rendered, err) = text(&out);
    assert!(out.status.success(), "{err}");
    assert!(rendered.contains("NAME"), "{rendered}");
    assert!(rendered.contains("--detailed-exitcode"), "{rendered}");
}

fn repo(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn yaml(rel: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(repo(rel)).expect("read example");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The GitHub Actions example parses and wires plan (PR) and apply (main) as documented.
#[test]
fn github_actions_example_parses() {
    let v = yaml("examples/ci/github-actions.yml");
    assert!(v["on"]["pull_request"].is_object(), "{v}");
    assert_eq!(v["on"]["push"]["branches"][0], "main");
    assert_eq!(v["concurrency"]["group"], "keyplan");
    assert_eq!(v["concurrency"]["cancel-in-progress"], false);
    let runs = |job: &str| -> String {
        v["jobs"][job]["steps"]
            .as_array()
            .unwrap_or_else(|| panic!("job {job}"))
            .iter()
            .filter_map(|s| s["run"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let plan = runs("plan");
    assert!(plan.contains("keyplan validate"), "{plan}");
    assert!(
        plan.contains("keyplan plan $KEYPLAN_ARGS --detailed-exitcode -o keyplan.plan"),
        "{plan}"
    );
    // The apply job applies exactly the plan it printed and uploaded, in the same job.
    let apply = runs("apply");
    let saved = apply
        .find("keyplan plan $KEYPLAN_ARGS -o keyplan.plan | tee plan.txt")
        .expect(&apply);
    let applied = apply
        .find("keyplan apply $KEYPLAN_ARGS keyplan.plan")
        .expect(&apply);
    assert!(saved < applied, "{apply}");
    assert!(!apply.contains("--auto-approve"), "{apply}");
    assert!(apply.contains("set -o pipefail"), "{apply}");
    let steps = v["jobs"]["apply"]["steps"].as_array().unwrap();
    assert!(
        steps.iter().any(|s| s["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/upload-artifact"))
            && s["with"]["path"].as_str().unwrap().contains("keyplan.plan")),
        "the applied plan is uploaded"
    );
    // Every keyplan command of the apply job (status included) has the KMS token.
    assert_eq!(
        v["jobs"]["apply"]["env"]["VAULT_TOKEN"],
        "${{ secrets.KEYPLAN_VAULT_TOKEN }}"
    );
    assert!(apply.contains("keyplan status -f keyplan.yaml"), "{apply}");
    // The plan job's token may write (plan checks it could), and forks do not get it.
    let plan_if = v["jobs"]["plan"]["if"].as_str().unwrap();
    assert!(plan_if.contains("pull_request"), "{plan_if}");
    assert!(
        plan_if.contains("head.repo.full_name == github.repository"),
        "{plan_if}"
    );
    let plan_step = v["jobs"]["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "plan")
        .unwrap();
    assert_eq!(
        plan_step["env"]["VAULT_TOKEN"],
        "${{ secrets.KEYPLAN_VAULT_TOKEN_PLAN }}"
    );
    let text = std::fs::read_to_string(repo("examples/ci/github-actions.yml")).unwrap();
    assert!(text.contains("sys/capabilities-self"), "the token note");
    // The global flags the example uses exist.
    let env = v["env"]["KEYPLAN_ARGS"].as_str().unwrap();
    assert_eq!(env, "--log-format json -f keyplan.yaml");
}

/// The GitLab CI example parses; apply is serialised by a resource group.
#[test]
fn gitlab_ci_example_parses() {
    let v = yaml("examples/ci/gitlab-ci.yml");
    assert_eq!(v["apply"]["resource_group"], "keyplan");
    assert_eq!(v["plan"]["allow_failure"]["exit_codes"][0], 2);
    let plan = v["plan"]["script"][0].as_str().unwrap();
    assert!(plan.contains("--detailed-exitcode"), "{plan}");
    assert!(plan.contains("set -o pipefail"), "{plan}");
    // Plan, then apply exactly that saved plan, in one job; the plan is kept.
    let apply: Vec<&str> = v["apply"]["script"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(
        apply,
        [
            "set -o pipefail; keyplan plan $KEYPLAN_ARGS -o keyplan.plan | tee plan.txt",
            "keyplan apply $KEYPLAN_ARGS keyplan.plan"
        ]
    );
    assert_eq!(
        v["apply"]["artifacts"]["paths"],
        serde_json::json!(["keyplan.plan", "plan.txt"])
    );
    let text = std::fs::read_to_string(repo("examples/ci/gitlab-ci.yml")).unwrap();
    assert!(text.contains("same host runner"), "the artifact note");
    assert!(text.contains("sys/capabilities-self"), "the token note");
}

/// `key=value` pairs of one `[section]` of a unit file (comments skipped; repeated keys kept).
fn unit_section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut cur = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        if l.starts_with('[') && l.ends_with(']') {
            cur = l[1..l.len() - 1].to_string();
            continue;
        }
        if cur == section {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {l}"));
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    pairs
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The systemd units hold the keys the README promises, and `systemd-analyze verify` accepts
/// them (when installed), with keyplan's path pointed at the binary under test.
#[test]
fn systemd_example_units_are_valid() {
    let service = std::fs::read_to_string(repo("examples/systemd/keyplan-apply.service")).unwrap();
    let timer = std::fs::read_to_string(repo("examples/systemd/keyplan-apply.timer")).unwrap();
    let svc = unit_section(&service, "Service");
    assert_eq!(get(&svc, "Type"), ["oneshot"]);
    assert_eq!(
        get(&svc, "ExecStart"),
        ["/usr/local/bin/keyplan apply --auto-approve -f /etc/keyplan/keyplan.yaml --state-dir /var/lib/keyplan"]
    );
    assert_eq!(get(&svc, "KillMode"), ["mixed"]);
    assert_eq!(get(&svc, "StateDirectory"), ["keyplan"]);
    // Under ProtectSystem=strict only /run/cryptsetup (and the StateDirectory) are writable;
    // a file KMS directory must be added by the operator (a commented example is there).
    assert_eq!(get(&svc, "ProtectSystem"), ["strict"]);
    assert_eq!(get(&svc, "ReadWritePaths"), ["/run/cryptsetup"]);
    assert!(service.contains("\n#ReadWritePaths=/etc/keyplan/keys\n"));
    assert!(!get(&svc, "TimeoutStopSec").is_empty());
    assert!(
        get(&svc, "PrivateDevices").is_empty(),
        "would hide the devices"
    );
    let tim = unit_section(&timer, "Timer");
    assert_eq!(get(&tim, "OnCalendar"), ["daily"]);
    assert_eq!(get(&tim, "Persistent"), ["true"]);
    assert!(!get(&tim, "RandomizedDelaySec").is_empty());
    assert_eq!(
        get(&unit_section(&timer, "Install"), "WantedBy"),
        ["timers.target"]
    );

    let status_service =
        std::fs::read_to_string(repo("examples/systemd/keyplan-status.service")).unwrap();
    let status_timer =
        std::fs::read_to_string(repo("examples/systemd/keyplan-status.timer")).unwrap();
    let ssvc = unit_section(&status_service, "Service");
    assert_eq!(get(&ssvc, "Type"), ["oneshot"]);
    assert_eq!(
        get(&ssvc, "ExecStart"),
        ["/usr/local/bin/keyplan status -q -f /etc/keyplan/keyplan.yaml --state-dir /var/lib/keyplan --format prometheus -o /var/lib/prometheus/node-exporter/keyplan.prom"]
    );
    assert_eq!(
        get(&ssvc, "SuccessExitStatus"),
        ["1"],
        "unhealthy is not a unit failure"
    );
    let stim = unit_section(&status_timer, "Timer");
    assert_eq!(get(&stim, "OnUnitActiveSec"), ["15min"]);
    assert_eq!(get(&stim, "Unit"), ["keyplan-status.service"]);

    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        eprintln!("systemd-analyze not installed: skipping unit verification");
        return;
    }
    let s = Scratch::new();
    let bin = keyplan_bin();
    std::fs::write(
        s.path("keyplan-apply.service"),
        service.replace("/usr/local/bin/keyplan", bin.to_str().unwrap()),
    )
    .unwrap();
    std::fs::write(s.path("keyplan-apply.timer"), &timer).unwrap();
    std::fs::write(
        s.path("keyplan-status.service"),
        status_service.replace("/usr/local/bin/keyplan", bin.to_str().unwrap()),
    )
    .unwrap();
    std::fs::write(s.path("keyplan-status.timer"), &status_timer).unwrap();
    let out = Command::new("systemd-analyze")
        .current_dir(s.dir.path())
        .args([
            "verify",
            "--man=no",
            "./keyplan-apply.service",
            "./keyplan-apply.timer",
            "./keyplan-status.service",
            "./keyplan-status.timer",
        ])
        .output()
        .expect("systemd-analyze");
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}{e}");
    assert!(!e.contains("Unknown key"), "{e}");
}

/// The fleet GitHub Actions example parses: the pull request job runs `fleet plan` with
/// `--detailed-exitcode` and fails only on exit 1; the publish job signs before it publishes
/// the plan and its signature in one ConfigMap update.
#[test]
fn github_actions_fleet_example_parses() {
    let v = yaml("examples/ci/github-actions-fleet.yml");
    let runs = |job: &str| -> String {
        v["jobs"][job]["steps"]
            .as_array()
            .unwrap_or_else(|| panic!("job {job}"))
            .iter()
            .filter_map(|s| s["run"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let plan = runs("fleet-plan");
    assert!(plan.contains("keyplan validate -f plan.yaml"), "{plan}");
    assert!(
        plan.contains("keyplan fleet plan -f plan.yaml") && plan.contains("--detailed-exitcode"),
        "{plan}"
    );
    assert!(
        plan.contains("if [ \"$code\" -eq 1 ]; then exit 1; fi"),
        "{plan}"
    );
    let publish = runs("publish");
    let signed = publish
        .find("keyplan sign plan.yaml --cluster")
        .expect(&publish);
    let published = publish.find("--from-file=plan.yaml.sig").expect(&publish);
    assert!(signed < published, "{publish}");
    // The signing key comes from a secret, only in the publish job.
    let sign_step = v["jobs"]["publish"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "Sign")
        .unwrap();
    assert_eq!(
        sign_step["env"]["KEYPLAN_SIGNING_KEY"],
        "${{ secrets.KEYPLAN_SIGNING_KEY }}"
    );
    assert!(!v["jobs"]["fleet-plan"].to_string().contains("SIGNING_KEY"));
}

/// A command's help lists only the global options it uses (issue 32): `sign`, `fleet ...`,
/// `completions` and `man` do not offer `--state-dir` or `--node`, `validate` does not offer
/// `--node` (it checks the whole file); the commands that use them do. The hidden ones are
/// still accepted, so scripts that pass them everywhere keep working.
#[test]
fn help_lists_only_the_global_options_a_command_uses() {
    let s = Scratch::new();
    let help = |args: &[&str]| {
        let mut a = args.to_vec();
        a.push("--help");
        s.ok(&a, 0)
    };
    for args in [
        &["sign"][..],
        &["fleet", "status"],
        &["fleet", "plan"],
        &["completions"],
        &["man"],
    ] {
        let text = help(args);
        assert!(
            !text.contains("--state-dir") && !text.contains("--node"),
            "keyplan {args:?} --help:\n{text}"
        );
    }
    let text = help(&["validate"]);
    assert!(
        !text.contains("--node") && text.contains("--state-dir"),
        "{text}"
    );
    for args in [&["plan"][..], &["apply"], &["status"], &["agent"]] {
        let text = help(args);
        assert!(
            text.contains("--state-dir") && text.contains("--node"),
            "keyplan {args:?} --help:\n{text}"
        );
    }
    let text = s.ok(&["completions", "bash", "--state-dir", "/nonexistent"], 0);
    assert!(text.contains("complete"), "{text}");
    let man = s.ok(&["man"], 0);
    assert!(
        man.contains("state\\-dir") || man.contains("state-dir"),
        "the top page lists it"
    );
}
