//! Plan-file loading (docs/plan-file.md): valid plans in YAML and TOML, and every error class with
//! the `file:line:column` the rendered report points at.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keyplan::spec::{
    self, find_default, load, load_str, Format, KmsConfig, PathSeg, PbkdfType, Plan,
    UnmanagedKeyslots,
};

// ---------------------------------------------------------------------------------------------
// helpers

fn render(report: &miette::Report) -> String {
    let mut out = String::new();
    miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
        .with_width(1000)
        .render_report(&mut out, report.as_ref())
        .unwrap();
    out
}

fn yaml(text: &str) -> Result<Plan, miette::Report> {
    load_str(text, "plan.yaml", Format::Yaml, Path::new("/plans"))
}

fn toml(text: &str) -> Result<Plan, miette::Report> {
    load_str(text, "plan.toml", Format::Toml, Path::new("/plans"))
}

fn yaml_err(text: &str) -> String {
    match yaml(text) {
        Ok(_) => panic!("plan accepted:\n{text}"),
        Err(e) => render(&e),
    }
}

fn toml_err(text: &str) -> String {
    match toml(text) {
        Ok(_) => panic!("plan accepted:\n{text}"),
        Err(e) => render(&e),
    }
}

/// The report points at `location` (e.g. `plan.yaml:7:19`) and says `phrase`.
#[track_caller]
fn assert_report(rendered: &str, location: &str, phrase: &str) {
    assert!(
        rendered.contains(&format!("[{location}]")),
        "expected location {location} in:\n{rendered}"
    );
    assert!(
        rendered.contains(phrase),
        "expected {phrase:?} in:\n{rendered}"
    );
    assert!(
        rendered.contains("help:"),
        "expected a help text in:\n{rendered}"
    );
}

fn k(s: &str) -> PathSeg {
    PathSeg::Key(s.to_owned())
}

/// Lines 1-11 of most error plans: one file KMS, two keys. Test text continues at line 12.
const HEAD: &str = "\
version: 1
kms:
  local:
    provider: file
    path: keys
keys:
  data-kek:
    kms: local
    rotate_after: 90d
  db-kek:
    kms: local
";

fn head(rest: &str) -> String {
    format!("{HEAD}{rest}")
}

const FULL_YAML: &str = "\
version: 1
state_dir: state
kms:
  local:
    provider: file
    path: keys
  vault:
    provider: vault
    address: http://127.0.0.1:8200
keys:
  data-kek:
    kms: local
    rotate_after: 90d
  db-kek:
    kms: local
    name: db.key
    rotate_after: 12h
    bytes: 64
  remote:
    kms: vault
    name: ceph/osd/remote
devices:
  osd0:
    path: images/osd0.img
    uuid: 3F9C0000-0000-4000-8000-000000000000
    keys:
      - data-kek
      - { key: db-kek, keyslot: 3 }
    enroll_with: initial.pass
  osd1:
    path: /dev/disk/by-partuuid/abc
    keys:
      - key: remote
      - key: data-kek
        keyslot: 7
    unmanaged_keyslots: remove
settings:
  pbkdf: { type: pbkdf2, iterations: 1000 }
  parallelism: 2
";

const FULL_TOML: &str = r#"version = 1
state_dir = "state"

[kms.local]
provider = "file"
path = "keys"

[kms.vault]
provider = "vault"
address = "http://127.0.0.1:8200"

[keys.data-kek]
kms = "local"
rotate_after = "90d"

[keys.db-kek]
kms = "local"
name = "db.key"
rotate_after = "12h"
bytes = 64

[keys.remote]
kms = "vault"
name = "ceph/osd/remote"

[devices.osd0]
path = "images/osd0.img"
uuid = "3F9C0000-0000-4000-8000-000000000000"
keys = ["data-kek", { key = "db-kek", keyslot = 3 }]
enroll_with = "initial.pass"

[devices.osd1]
path = "/dev/disk/by-partuuid/abc"
unmanaged_keyslots = "remove"

[[devices.osd1.keys]]
key = "remote"

[[devices.osd1.keys]]
key = "data-kek"
keyslot = 7

[settings]
pbkdf = { type = "pbkdf2", iterations = 1000 }
parallelism = 2
"#;

fn check_full(plan: &Plan) {
    assert_eq!(plan.base_dir, PathBuf::from("/plans"));
    assert_eq!(plan.state_dir, PathBuf::from("/plans/state"));
    assert_eq!(
        plan.kms.get("local"),
        Some(&KmsConfig::File {
            path: "/plans/keys".to_owned()
        })
    );
    assert_eq!(plan.kms.get("vault").map(|k| k.provider()), Some("vault"));

    let dk = &plan.keys["data-kek"];
    assert_eq!(dk.id, "data-kek");
    assert_eq!(dk.name, "data-kek", "name defaults to the id");
    assert_eq!(dk.kms, "local");
    assert_eq!(dk.bytes, 32, "bytes defaults to 32");
    assert_eq!(dk.rotate_after, Some(Duration::from_secs(90 * 86_400)));
    assert_eq!(dk.rotate_after_text.as_deref(), Some("90d"));
    let db = &plan.keys["db-kek"];
    assert_eq!(db.name, "db.key");
    assert_eq!(db.bytes, 64);
    assert_eq!(db.rotate_after, Some(Duration::from_secs(12 * 3600)));
    let remote = &plan.keys["remote"];
    assert_eq!(remote.name, "ceph/osd/remote");
    assert_eq!(remote.rotate_after, None);

    let osd0 = &plan.devices["osd0"];
    assert_eq!(osd0.id, "osd0");
    assert_eq!(osd0.path, PathBuf::from("/plans/images/osd0.img"));
    assert_eq!(
        osd0.uuid.as_deref(),
        Some("3F9C0000-0000-4000-8000-000000000000")
    );
    assert_eq!(osd0.enroll_with, Some(PathBuf::from("/plans/initial.pass")));
    assert_eq!(osd0.unmanaged, UnmanagedKeyslots::Keep);
    assert_eq!(osd0.keys.len(), 2);
    assert_eq!(osd0.keys[0].key, "data-kek");
    assert_eq!(osd0.keys[0].keyslot, None);
    assert_eq!(osd0.keys[1].key, "db-kek");
    assert_eq!(osd0.keys[1].keyslot, Some(3));
    let osd1 = &plan.devices["osd1"];
    assert_eq!(osd1.path, PathBuf::from("/dev/disk/by-partuuid/abc"));
    assert_eq!(osd1.unmanaged, UnmanagedKeyslots::Remove);
    assert_eq!(osd1.keys[0].keyslot, None);
    assert_eq!(osd1.keys[1].keyslot, Some(7));

    let pbkdf = plan.pbkdf.as_ref().unwrap();
    assert_eq!(pbkdf.kind, PbkdfType::Pbkdf2);
    assert_eq!(pbkdf.iterations, Some(1000));
    assert_eq!(plan.parallelism, 2);
}

// ---------------------------------------------------------------------------------------------
// valid plans

#[test]
fn valid_yaml_is_resolved() {
    let plan = yaml(FULL_YAML).unwrap();
    check_full(&plan);
    assert_eq!(plan.format(), Format::Yaml);
    assert_eq!(plan.source_path, PathBuf::from("plan.yaml"));
}

#[test]
fn valid_toml_is_resolved() {
    let plan = toml(FULL_TOML).unwrap();
    check_full(&plan);
    assert_eq!(plan.format(), Format::Toml);
}

#[test]
fn yaml_and_toml_give_equal_plans() {
    let y = yaml(FULL_YAML).unwrap();
    let t = toml(FULL_TOML).unwrap();
    assert_eq!(y.keys, t.keys);
    assert_eq!(y.devices, t.devices);
    assert_eq!(y.kms, t.kms);
    assert_eq!(y.state_dir, t.state_dir);
    assert_eq!(y.pbkdf, t.pbkdf);
    assert_eq!(y.parallelism, t.parallelism);
}

#[test]
fn defaults_for_a_minimal_plan() {
    let plan = yaml("version: 1\n").unwrap();
    assert_eq!(plan.state_dir, PathBuf::from("/plans/.keyplan"));
    assert_eq!(plan.parallelism, 4);
    assert!(plan.pbkdf.is_none());
    assert!(plan.keys.is_empty() && plan.devices.is_empty() && plan.kms.is_empty());
}

#[test]
fn relative_base_dir_is_made_absolute() {
    let plan = load_str(
        "version: 1\ndevices:\n  d:\n    path: ./img/../d.img\n",
        "plan.yaml",
        Format::Yaml,
        Path::new("sub"),
    )
    .unwrap();
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(plan.base_dir, cwd.join("sub"));
    assert!(plan.devices["d"].path.is_absolute());
    // `..` is kept as written: symlinks are resolved by the engine, not here.
    assert_eq!(plan.devices["d"].path, cwd.join("sub/img/../d.img"));
    assert_eq!(plan.state_dir, cwd.join("sub/.keyplan"));
}

// ---------------------------------------------------------------------------------------------
// parser errors: unknown fields, missing fields, types, syntax

#[test]
fn unknown_field_at_top_level() {
    let r = yaml_err(&head("bogus: 1\n"));
    assert_report(&r, "plan.yaml:12:1", "unknown field `bogus`");
    assert!(r.contains("expected one of"), "{r}");
}

#[test]
fn unknown_field_in_device() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    pth: x\n",
    ));
    assert_report(
        &r,
        "plan.yaml:15:5",
        "devices.osd0.pth: unknown field `pth`",
    );
    assert!(r.contains("enroll_with"), "lists the allowed fields: {r}");
}

#[test]
fn unknown_field_in_pinned_key_entry() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys:\n      - data-kek\n      - { key: db-kek, slot: 3 }\n",
    ));
    assert_report(
        &r,
        "plan.yaml:17:24",
        "devices.osd0.keys[1].slot: unknown field `slot`",
    );
    assert!(r.contains("keyslot"), "{r}");
}

#[test]
fn unknown_field_in_pbkdf() {
    let r = yaml_err(&head(
        "settings:\n  pbkdf:\n    type: pbkdf2\n    iterations: 1000\n    memory: 5\n",
    ));
    assert_report(
        &r,
        "plan.yaml:16:5",
        "settings.pbkdf.memory: unknown field `memory`",
    );
    assert!(r.contains("memory_kib"), "{r}");
}

#[test]
fn unknown_field_in_kms_instance() {
    // `kms` entries are an internally tagged enum: serde reports at the entry; we find the field.
    let r =
        yaml_err("version: 1\nkms:\n  local:\n    provider: file\n    path: k\n    mode: 0700\n");
    assert_report(&r, "plan.yaml:6:5", "kms.local.mode: unknown field `mode`");
}

#[test]
fn unknown_field_in_toml() {
    let r = toml_err("version = 1\n[devices.osd0]\npath = \"/dev/osd0\"\nuid = \"x\"\n");
    assert_report(&r, "plan.toml:4:1", "devices.osd0.uid: unknown field `uid`");
}

/// A TOML plan's errors quote its settings in TOML (`key = "value"`), as its advice is to be
/// copied into it; YAML syntax there would not parse (issue 46).
#[test]
fn toml_errors_quote_toml_syntax() {
    let r = toml_err(
        "version = 1\n[kms.local]\nprovider = \"file\"\npath = \"k\"\n[keys.k]\nkms = \"local\"\nrotate_after = \"90x\"\n[devices.a]\npath = \"/dev/a\"\nkeys = [\"k\"]\nunmanaged_keyslots = { keep = [] }\n[devices.b]\npath = \"/dev/b\"\nunmanaged_keyslots = \"remove\"\n",
    );
    for toml in [
        "`rotate_after = \"90x\"`",
        "`keep = []`",
        "`unmanaged_keyslots = \"remove\"`",
        "`unmanaged_keyslots = \"keep\"`",
    ] {
        assert!(r.contains(toml), "expected {toml} in:\n{r}");
    }
    for yaml in ["rotate_after: ", "keep: []", "unmanaged_keyslots: "] {
        assert!(
            !r.contains(yaml),
            "YAML {yaml:?} in a TOML plan's errors:\n{r}"
        );
    }
    // A YAML plan's errors keep YAML.
    let r = yaml_err("version: 1\nkms:\n  local: { provider: file, path: k }\nkeys:\n  k: { kms: local, rotate_after: 90x }\n");
    assert!(r.contains("`rotate_after: 90x`"), "{r}");
}

#[test]
fn unknown_kms_provider() {
    let r = yaml_err("version: 1\nkms:\n  local:\n    provider: files\n    path: k\n");
    assert_report(&r, "plan.yaml:4:15", "unknown variant `files`");
}

#[test]
fn missing_version() {
    let r = yaml_err("kms: {}\n");
    assert_report(&r, "plan.yaml:1:1", "missing field `version`");
    assert!(r.contains("version: 1"), "help shows the line to add: {r}");
    let r = toml_err("[kms]\n");
    assert!(r.contains("missing field `version`"), "{r}");
    assert!(r.contains("version = 1"), "{r}");
}

#[test]
fn missing_device_path() {
    let r = yaml_err(&head("devices:\n  osd0:\n    keys: [data-kek]\n"));
    assert_report(&r, "plan.yaml:13:3", "devices.osd0: missing field `path`");
}

#[test]
fn version_2_is_refused() {
    let r = yaml_err("version: 2\nsomething_new: true\n");
    assert_report(&r, "plan.yaml:1:10", "unsupported plan format version 2");
    let r = toml_err("version = 2\n");
    assert_report(&r, "plan.toml:1:11", "unsupported plan format version 2");
}

#[test]
fn wrong_type_keys_not_a_list() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys: notalist\n",
    ));
    assert_report(
        &r,
        "plan.yaml:15:11",
        "devices.osd0.keys: expected a list, found `notalist`",
    );
    let r = toml_err("version = 1\n[devices.osd0]\npath = \"/dev/osd0\"\nkeys = \"notalist\"\n");
    assert_report(&r, "plan.toml:4:8", "expected a sequence");
    assert!(r.contains("devices.osd0.keys"), "{r}");
}

#[test]
fn wrong_type_number() {
    let r = yaml_err(&head("settings:\n  parallelism: many\n"));
    assert_report(
        &r,
        "plan.yaml:13:16",
        "settings.parallelism: expected a whole number",
    );
}

#[test]
fn bad_yaml_syntax() {
    let r = yaml_err("version: 1\nkms:\n  local: {provider: file, path: keys\n");
    assert!(r.contains("invalid YAML"), "{r}");
    assert!(r.contains("[plan.yaml:3:"), "{r}");
    assert!(r.contains("help:"), "{r}");
}

#[test]
fn bad_toml_syntax() {
    let r = toml_err("version = 1\n[kms.local\nprovider = \"file\"\n");
    assert_report(&r, "plan.toml:2:11", "invalid TOML");
}

#[test]
fn duplicate_mapping_key() {
    let r = yaml_err("version: 1\nkeys:\n  a: {kms: x}\n  a: {kms: y}\n");
    assert_report(&r, "plan.yaml:4:3", "duplicate key `a`");
    let r = toml_err("version = 1\nversion = 1\n");
    assert_report(&r, "plan.toml:2:1", "duplicate key");
}

#[test]
fn empty_plan_file() {
    let r = yaml_err("# nothing yet\n\n");
    assert!(r.contains("is empty"), "{r}");
    assert!(r.contains("version: 1"), "{r}");
    let r = toml_err("");
    assert!(r.contains("is empty"), "{r}");
}

// ---------------------------------------------------------------------------------------------
// semantic errors

#[test]
fn undefined_kms() {
    let r = yaml_err("version: 1\nkms:\n  local:\n    provider: file\n    path: k\nkeys:\n  k:\n    kms: vault\n");
    assert_report(
        &r,
        "plan.yaml:8:10",
        "key `k` uses KMS `vault`, which is not defined",
    );
    assert!(
        r.contains("`local`"),
        "help lists the defined instances: {r}"
    );
}

#[test]
fn undefined_key_on_device() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys:\n      - data-kek\n      - nope\n",
    ));
    assert_report(
        &r,
        "plan.yaml:17:9",
        "device `osd0` lists key `nope`, which is not defined",
    );
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys:\n      - { key: nope, keyslot: 1 }\n",
    ));
    assert_report(&r, "plan.yaml:16:16", "lists key `nope`");
}

#[test]
fn undefined_key_in_toml() {
    let text = "version = 1\n[kms.local]\nprovider = \"file\"\npath = \"keys\"\n[keys.k]\nkms = \"local\"\n[devices.osd0]\npath = \"/dev/osd0\"\nkeys = [\"k\", \"nope\"]\n";
    let r = toml_err(text);
    assert_report(&r, "plan.toml:9:14", "lists key `nope`");
}

#[test]
fn duplicate_key_on_one_device() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys:\n      - data-kek\n      - db-kek\n      - data-kek\n",
    ));
    assert_report(
        &r,
        "plan.yaml:18:9",
        "key `data-kek` is listed twice on device `osd0`",
    );
    assert!(r.contains("first listed here"), "{r}");
}

#[test]
fn two_keys_pinned_to_one_keyslot() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys:\n      - { key: data-kek, keyslot: 2 }\n      - { key: db-kek, keyslot: 2 }\n",
    ));
    assert_report(
        &r,
        "plan.yaml:17:33",
        "keyslot 2 is pinned for both key `data-kek` and key `db-kek`",
    );
}

#[test]
fn keyslot_40_is_out_of_range() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys:\n      - { key: data-kek, keyslot: 40 }\n",
    ));
    assert_report(
        &r,
        "plan.yaml:16:35",
        "keyslot 40 for key `data-kek` is out of range",
    );
    assert!(r.contains("0-31"), "{r}");
}

fn duration_plan(value: &str) -> String {
    format!("version: 1\nkms:\n  local:\n    provider: file\n    path: keys\nkeys:\n  k:\n    kms: local\n    rotate_after: {value}\n")
}

#[test]
fn bad_duration_unknown_unit() {
    let r = yaml_err(&duration_plan("90x"));
    assert_report(&r, "plan.yaml:9:19", "unit `x`, which is not accepted");
    assert!(
        r.contains("s (seconds), m (minutes), h (hours), d (days), w (weeks)"),
        "{r}"
    );
}

#[test]
fn bad_duration_months() {
    let r = yaml_err(&duration_plan("3 months"));
    assert_report(&r, "plan.yaml:9:19", "unit `months`, which is not accepted");
    assert!(r.contains("months and years are not accepted"), "{r}");
    let r = yaml_err(&duration_plan("1y"));
    assert_report(&r, "plan.yaml:9:19", "unit `y`");
}

#[test]
fn bad_duration_zero() {
    let r = yaml_err(&duration_plan("0d"));
    assert_report(&r, "plan.yaml:9:19", "is zero");
}

#[test]
fn bad_duration_garbage() {
    let r = yaml_err(&duration_plan("soon"));
    assert_report(&r, "plan.yaml:9:19", "is not a duration");
    let r = yaml_err(&duration_plan("90"));
    assert_report(&r, "plan.yaml:9:19", "has no unit");
}

#[test]
fn good_durations() {
    for (text, secs) in [
        ("90d", 90 * 86_400),
        ("12h", 12 * 3600),
        ("2w", 14 * 86_400),
        ("45m", 45 * 60),
        ("30s", 30),
        ("1w 2d", 9 * 86_400),
    ] {
        let plan = yaml(&duration_plan(text)).unwrap();
        assert_eq!(
            plan.keys["k"].rotate_after,
            Some(Duration::from_secs(secs)),
            "{text}"
        );
    }
}

#[test]
fn bytes_8_is_too_few() {
    let r = yaml_err("version: 1\nkms:\n  local:\n    provider: file\n    path: keys\nkeys:\n  k:\n    kms: local\n    bytes: 8\n");
    assert_report(&r, "plan.yaml:9:12", "`bytes` is 8");
    assert!(r.contains("between 16 and 512"), "{r}");
    assert!(yaml(
        "version: 1\nkms:\n  l: {provider: file, path: k}\nkeys:\n  k: {kms: l, bytes: 513}\n"
    )
    .is_err());
    assert!(yaml(
        "version: 1\nkms:\n  l: {provider: file, path: k}\nkeys:\n  k: {kms: l, bytes: 16}\n"
    )
    .is_ok());
}

#[test]
fn parallelism_0() {
    let r = yaml_err(&head("settings:\n  parallelism: 0\n"));
    assert_report(&r, "plan.yaml:13:16", "`parallelism` is 0");
}

#[test]
fn duplicate_uuid_ignores_case() {
    let r = yaml_err(&head(
        "devices:\n  osd0:\n    path: /dev/a\n    uuid: abc-DEF\n  osd1:\n    path: /dev/b\n    uuid: ABC-def\n",
    ));
    assert_report(
        &r,
        "plan.yaml:18:11",
        "device `osd1` has the same LUKS UUID as device `osd0`",
    );
    assert!(r.contains("device `osd0` is first"), "{r}");
}

#[test]
fn duplicate_device_is_reported_at_the_second_in_file_order() {
    // `b` comes first in the file although `a` sorts first.
    let r = yaml_err("version: 1\ndevices:\n  b:\n    path: /dev/x\n  a:\n    path: /dev/./x\n");
    assert_report(
        &r,
        "plan.yaml:6:11",
        "device `a` has the same path as device `b`",
    );
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn duplicate_device_path_spelled_twice() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    write(&dir.path().join("disk.img"), "");
    let plan_path = dir.path().join("plan.yaml");
    write(
        &plan_path,
        &format!(
            "version: 1\ndevices:\n  osd0:\n    path: disk.img\n  osd1:\n    path: ./sub/../disk.img\n  osd2:\n    path: {}\n",
            dir.path().join("disk.img").display()
        ),
    );
    let r = render(&load(&plan_path).unwrap_err());
    let name = plan_path.display().to_string();
    assert_report(
        &r,
        &format!("{name}:6:11"),
        "device `osd1` has the same path as device `osd0`",
    );
    assert_report(
        &r,
        &format!("{name}:8:11"),
        "device `osd2` has the same path as device `osd0`",
    );
    assert!(r.contains("2 errors"), "{r}");
}

#[cfg(unix)]
#[test]
fn duplicate_device_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("disk.img"), "");
    std::os::unix::fs::symlink("disk.img", dir.path().join("link.img")).unwrap();
    let plan_path = dir.path().join("plan.yaml");
    write(
        &plan_path,
        "version: 1\ndevices:\n  osd0:\n    path: disk.img\n  osd1:\n    path: link.img\n",
    );
    let r = render(&load(&plan_path).unwrap_err());
    assert_report(
        &r,
        &format!("{}:6:11", plan_path.display()),
        "device `osd1` has the same path as device `osd0`",
    );

    // Alone, the symlink is kept as written (not canonicalized).
    write(
        &plan_path,
        "version: 1\ndevices:\n  osd1:\n    path: link.img\n",
    );
    let plan = load(&plan_path).unwrap();
    assert_eq!(plan.devices["osd1"].path, dir.path().join("link.img"));
}

#[test]
fn file_kms_key_names_must_be_safe_file_names() {
    let r = yaml_err("version: 1\nkms:\n  local:\n    provider: file\n    path: keys\nkeys:\n  k:\n    kms: local\n    name: ../etc/passwd\n");
    assert_report(
        &r,
        "plan.yaml:9:11",
        "key name `../etc/passwd` is not a safe file name",
    );
    let r = yaml_err("version: 1\nkms:\n  local:\n    provider: file\n    path: keys\nkeys:\n  .hidden:\n    kms: local\n");
    assert_report(
        &r,
        "plan.yaml:7:3",
        "key name `.hidden` is not a safe file name",
    );
    // Other providers may use paths as names.
    assert!(yaml("version: 1\nkms:\n  v: {provider: vault, address: http://x}\nkeys:\n  k: {kms: v, name: a/b/c}\n").is_ok());
}

#[test]
fn ids_must_be_plain() {
    let r = yaml_err("version: 1\nkms:\n  \"my kms\":\n    provider: file\n    path: k\ndevices:\n  \"osd/0\":\n    path: /dev/x\n");
    assert_report(
        &r,
        "plan.yaml:3:3",
        "`my kms` is not a valid KMS instance name",
    );
    assert_report(&r, "plan.yaml:7:3", "`osd/0` is not a valid device id");
}

#[test]
fn empty_paths_are_refused() {
    let r = yaml_err("version: 1\ndevices:\n  d:\n    path: \"\"\n    enroll_with: \"\"\n");
    assert_report(&r, "plan.yaml:4:11", "`path` is empty");
    assert_report(&r, "plan.yaml:5:18", "`enroll_with` is empty");
}

#[test]
fn all_semantic_errors_are_reported_together() {
    let text = head(
        "devices:\n  osd0:\n    path: /dev/osd0\n    keys:\n      - nope\n      - { key: data-kek, keyslot: 99 }\nsettings:\n  parallelism: 0\n",
    );
    let err = yaml(&text).unwrap_err();
    let related: Vec<_> = err.related().map(|r| r.collect()).unwrap_or_default();
    assert_eq!(related.len(), 3, "{}", render(&err));
    let r = render(&err);
    assert!(r.contains("3 errors"), "{r}");
    assert!(r.contains("[plan.yaml:16:9]"), "{r}");
    assert!(r.contains("[plan.yaml:17:35]"), "{r}");
    assert!(r.contains("[plan.yaml:19:16]"), "{r}");
}

// ---------------------------------------------------------------------------------------------
// error_at / location_of

#[test]
fn error_at_points_at_a_pinned_keyslot() {
    let plan = yaml(FULL_YAML).unwrap();
    let path = [
        k("devices"),
        k("osd0"),
        k("keys"),
        PathSeg::Index(1),
        k("keyslot"),
    ];
    assert_eq!(plan.location_of(&path), Some((28, 33)));
    let r = render(&plan.error_at(
        &path,
        "keyslot 3 is in use by an unmanaged passphrase",
        Some("pin another keyslot".to_owned()),
    ));
    assert_report(&r, "plan.yaml:28:33", "keyslot 3 is in use");

    // Block style entry.
    let path = [
        k("devices"),
        k("osd1"),
        k("keys"),
        PathSeg::Index(1),
        k("keyslot"),
    ];
    assert_eq!(plan.location_of(&path), Some((35, 18)));
    let r = render(&plan.error_at(&path, "keyslot 7 is beyond LUKS1's 0-7? no: fine", None));
    assert!(r.contains("[plan.yaml:35:18]"), "{r}");
}

#[test]
fn error_at_in_toml() {
    let plan = toml(FULL_TOML).unwrap();
    let path = [
        k("devices"),
        k("osd1"),
        k("keys"),
        PathSeg::Index(1),
        k("keyslot"),
    ];
    assert_eq!(plan.location_of(&path), Some((41, 11)));
    let r = render(&plan.error_at(&path, "keyslot 7 is taken", Some("pick another".to_owned())));
    assert_report(&r, "plan.toml:41:11", "keyslot 7 is taken");
}

#[test]
fn error_at_falls_back_to_the_nearest_ancestor() {
    let plan = yaml(FULL_YAML).unwrap();
    // osd0's first key is not pinned: point at the entry itself.
    let path = [
        k("devices"),
        k("osd0"),
        k("keys"),
        PathSeg::Index(0),
        k("keyslot"),
    ];
    assert_eq!(plan.location_of(&path), None);
    let r = render(&plan.error_at(
        &path,
        "no free keyslot for data-kek",
        Some("remove a keyslot".to_owned()),
    ));
    assert_report(&r, "plan.yaml:27:9", "no free keyslot");
    assert!(r.contains("not written in the plan"), "{r}");

    // Nothing of the path exists: the file, without a label.
    let r = render(&plan.error_at(&[k("nowhere")], "something went wrong", None));
    assert!(r.contains("plan.yaml"), "{r}");
    assert!(r.contains("something went wrong"), "{r}");
}

#[test]
fn location_of_keys_and_devices() {
    let plan = yaml(FULL_YAML).unwrap();
    assert_eq!(plan.location_of(&[k("devices"), k("osd1")]), Some((30, 3)));
    assert_eq!(
        plan.location_of(&[k("keys"), k("db-kek"), k("bytes")]),
        Some((18, 12))
    );
    assert_eq!(plan.location_of(&[k("devices"), k("osd9")]), None);
}

// ---------------------------------------------------------------------------------------------
// files: find_default, load, format detection

#[test]
fn find_default_none_one_many() {
    let dir = tempfile::tempdir().unwrap();
    let r = render(&find_default(dir.path()).unwrap_err());
    assert!(r.contains("keyplan.yaml, keyplan.yml, keyplan.toml"), "{r}");

    write(&dir.path().join("keyplan.toml"), "version = 1\n");
    assert_eq!(
        find_default(dir.path()).unwrap(),
        dir.path().join("keyplan.toml")
    );

    write(&dir.path().join("keyplan.yml"), "version: 1\n");
    let r = render(&find_default(dir.path()).unwrap_err());
    assert!(r.contains("keyplan.yml, keyplan.toml"), "{r}");
    assert!(r.contains("help:"), "{r}");
}

#[test]
fn load_resolves_against_the_plan_directory() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = dir.path().join("keyplan.yml");
    write(&plan_path, FULL_YAML);
    let plan = load(&plan_path).unwrap();
    assert_eq!(plan.source_path, plan_path);
    assert_eq!(plan.base_dir, dir.path());
    assert_eq!(
        plan.devices["osd0"].path,
        dir.path().join("images/osd0.img")
    );
    assert_eq!(
        plan.kms["local"],
        KmsConfig::File {
            path: dir.path().join("keys").display().to_string()
        }
    );
    assert_eq!(plan.state_dir, dir.path().join("state"));
}

#[test]
fn load_detects_the_format_of_other_extensions() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("plan.conf");
    write(&t, FULL_TOML);
    assert_eq!(load(&t).unwrap().format(), Format::Toml);
    let y = dir.path().join("plan");
    write(&y, FULL_YAML);
    assert_eq!(load(&y).unwrap().format(), Format::Yaml);
}

#[test]
fn load_missing_file() {
    let r = render(&load(Path::new("/nonexistent/keyplan.yaml")).unwrap_err());
    assert!(
        r.contains("cannot read plan file /nonexistent/keyplan.yaml"),
        "{r}"
    );
    assert!(r.contains("help:"), "{r}");
}

// ---------------------------------------------------------------------------------------------
// robustness

#[test]
fn no_panic_on_truncated_or_odd_input() {
    let mut inputs: Vec<(String, Format)> = Vec::new();
    for (text, format) in [(FULL_YAML, Format::Yaml), (FULL_TOML, Format::Toml)] {
        for (i, _) in text.char_indices() {
            inputs.push((text[..i].to_owned(), format));
        }
    }
    for odd in [
        "~", "- 1", "[]", "42", "version: 1\nkeys: [1]", "version: 1\ndevices:\n  d:\n",
        "version: 1\ndevices:\n  d: {path: x, keys: [[1]]}", "\u{feff}version: 1\n",
        "version: 1\r\nkeys:\r\n  k: {kms: x}\r\n", "version: 99999999999999999999999\n",
        "version: -1\n", "a: &x [*x]\n", "version: 1\nkeys:\n  ? [a]\n  : b\n",
        "version: 1\nkms:\n  é: {provider: file, path: \"\u{1F511}\"}\nkeys:\n  \u{1F511}: {kms: é}\n",
        "version: 1\nkeys:\n  k: {kms: x, rotate_after: 99999999999999999999999999w}\n",
        "version: 1\n---\nversion: 1\n",
    ] {
        inputs.push((odd.to_owned(), Format::Yaml));
    }
    for odd in [
        "version = 1979-05-27",
        "version = 1\n[devices]\nd = 1",
        "version = 1\nkeys = []",
        "version = 1\n[devices.d]\npath = \"x\"\nkeys = [[1]]",
        "\u{0}",
    ] {
        inputs.push((odd.to_owned(), Format::Toml));
    }
    for (text, format) in inputs {
        if let Err(e) = load_str(&text, "plan", format, Path::new("/p")) {
            let r = render(&e);
            assert!(!r.is_empty());
        }
    }
}

#[test]
fn plan_debug_does_not_dump_the_text() {
    let plan = yaml(FULL_YAML).unwrap();
    let dbg = format!("{plan:?}");
    assert!(!dbg.contains("rotate_after: 90d"), "{dbg}");
    let _ = spec::model::PlanFile::clone; // the model stays public
}

/// A plan with one vault instance whose remaining lines are `rest` (indented by 4).
fn vault_plan(address: &str, rest: &str) -> String {
    format!("version: 1\nkms:\n  v:\n    provider: vault\n    address: {address}\n{rest}")
}

#[test]
fn vault_auth_methods_resolve_their_files_against_the_plan() {
    let plan = yaml(&vault_plan(
        "https://vault:8200",
        "    auth: { method: cert, client_cert: c.pem, client_key: /abs/c.key }\n",
    ))
    .expect("valid");
    match &plan.kms["v"] {
        KmsConfig::Vault {
            auth:
                Some(keyplan::spec::VaultAuth::Cert {
                    client_cert,
                    client_key,
                    ..
                }),
            ..
        } => {
            assert_eq!(client_cert, "/plans/c.pem");
            assert_eq!(client_key, "/abs/c.key");
        }
        other => panic!("{other:?}"),
    }
    let plan = yaml(&vault_plan(
        "http://vault:8200",
        "    auth:\n      method: approle\n      role_id: r\n      secret_id_file: secret/id\n",
    ))
    .expect("valid");
    assert!(
        matches!(&plan.kms["v"], KmsConfig::Vault { auth: Some(keyplan::spec::VaultAuth::Approle { secret_id_file: Some(f), .. }), .. } if f == "/plans/secret/id")
    );
    assert!(yaml(&vault_plan(
        "http://vault:8200",
        "    auth: { method: kubernetes, role: keyplan }\n"
    ))
    .is_ok());
}

#[test]
fn vault_auth_mistakes_are_reported_where_they_are() {
    let r = yaml_err(&vault_plan(
        "http://vault:8200",
        "    token_env: T\n    auth: { method: token }\n",
    ));
    assert_report(&r, "plan.yaml:6:16", "`token_env` and `auth` are both set");
    let r = yaml_err(&vault_plan(
        "http://vault:8200",
        "    auth: { method: approle, secret_id_env: S }\n",
    ));
    assert_report(
        &r,
        "plan.yaml:6:21",
        "AppRole login needs `role_id` or `role_id_file`",
    );
    let r = yaml_err(&vault_plan(
        "http://vault:8200",
        "    auth: { method: approle, role_id: r, secret_id_file: f, secret_id_env: S }\n",
    ));
    assert!(
        r.contains("`secret_id_file` and `secret_id_env` are both set"),
        "{r}"
    );
    let r = yaml_err(&vault_plan(
        "http://vault:8200",
        "    auth: { method: cert, client_cert: c.pem, client_key: c.key }\n",
    ));
    assert!(
        r.contains("certificate login needs an `https://` address"),
        "{r}"
    );
    let r = yaml_err(&vault_plan(
        "http://vault:8200",
        "    auth: { method: kubernetes, role: \" \" }\n",
    ));
    assert!(r.contains("`role` is empty"), "{r}");
    let r = yaml_err(&vault_plan(
        "http://vault:8200",
        "    auth: { method: ldap }\n",
    ));
    assert!(r.contains("ldap"), "{r}");
}
