//! The shape of src/, checked on every test run (docs/architecture.md, "Layers"):
//!
//! - imports run one way: no import circle between files, and no file importing a module of
//!   a higher layer than its own (the layer table [`LAYERS`]);
//! - no file over [`MAX_FILE_LINES`] lines and no function over [`MAX_FN_LINES`] lines, except
//!   the files and functions listed in [`OVERSIZED`], each at most at the size it has today
//!   (the list may only shrink);
//! - comments cite files that exist in the repository (no design document from outside).
//!
//! An edge is a path `crate::a::b`, `super::x` or `self::y` (also inside `use` groups) in code
//! outside `#[cfg(test)]` items, comments and test-only files, resolved to the longest module
//! prefix that is a file. A module and its own direct child importing each other (`mod.rs`
//! re-exporting a child that uses its parent's items) is normal Rust and is not a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Largest file in src/, in lines.
const MAX_FILE_LINES: usize = 800;
/// Longest function in src/, in lines (signature to closing brace).
const MAX_FN_LINES: usize = 100;

/// The layers of src/, lowest first: a module may import modules of its own top-level module
/// and of lower layers only. Modules in one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    // Shared pieces with no knowledge of plans (the async runtime and Kubernetes clients that
    // the KMS providers and fleet mode share among them).
    &[
        "clock",
        "fsutil",
        "par",
        "failpoint",
        "secret",
        "child",
        "runtime",
        "kube_client",
    ],
    // Every stored and published format (data types, their versions and the refusal of a
    // newer one), below every reader and writer of them.
    &["format"],
    // The plan file.
    &["spec"],
    // The doors to the world, and the step graph.
    &["finding", "luks", "kms", "graph"],
    // The world as one object; the journal.
    &["world", "journal"],
    // The pipeline.
    &["observe"],
    &["diff"],
    &["apply"],
    &["saved"],
    // The engine error, above the engine (it names every part's error).
    &["error"],
    // The engine API.
    &["ops"],
    // Formatting for people and programs.
    &["render"],
    // Front ends.
    &["fleet"],
    &["cli", "fuzzing"],
];

/// Files and functions over the limits today, with their size in lines: none may grow, and an
/// entry that is back under the limit must be removed. `path` or `path::fn_name`.
const OVERSIZED: &[(&str, usize)] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A source file: its module path (`["kms", "vault"]`; `[]` for lib.rs and main.rs) and text.
struct File {
    module: Vec<String>,
    rel: String,
    text: String,
}

fn read_files() -> Vec<File> {
    let root = src_dir();
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("read src/").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(&root)
                .expect("under src/")
                .to_string_lossy()
                .into_owned();
            let mut module: Vec<String> = rel
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_owned)
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] {
                module.clear();
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.push(File { module, rel, text });
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

/// The text without comment lines and without `#[cfg(test)]` items (the attribute and the
/// braced block or `mod x;` after it).
fn code_only(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        if line.starts_with("#[cfg(test)]") {
            let mut depth = 0i64;
            let mut started = false;
            let mut j = i + 1;
            while j < lines.len() {
                let l = lines[j];
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                started |= l.contains('{');
                if (started && depth <= 0) || (!started && l.trim_end().ends_with(';')) {
                    break;
                }
                j += 1;
            }
            i = j + 1;
            continue;
        }
        if !line.starts_with("//") {
            out.push(lines[i]);
        }
        i += 1;
    }
    out.join("\n")
}

/// Modules declared `#[cfg(test)] mod x;`: test-only files, not part of the product's graph.
fn test_only_modules(files: &[File]) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for f in files {
        let lines: Vec<&str> = f.text.lines().map(str::trim).collect();
        for w in lines.windows(2) {
            if w[0] == "#[cfg(test)]" {
                let decl = w[1]
                    .trim_start_matches("pub ")
                    .trim_start_matches("pub(crate) ");
                if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                    let mut m = f.module.clone();
                    m.push(name.trim().to_owned());
                    out.insert(m);
                }
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path named in `code` that starts with `crate`, `super` or `self`, made absolute
/// from `module` (the file's module: `self` is it, `super` its parent, for `mod.rs` files too).
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_ident(chars[i]) || (i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        if !matches!(word.as_str(), "crate" | "super" | "self") {
            continue;
        }
        // `self` inside a module file is that module; `super` is its parent.
        let mut base: Vec<String> = match word.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            _ => module[..module.len().saturating_sub(1)].to_vec(),
        };
        i = path_tail(&chars, i, &mut base, &mut out);
    }
    out
}

/// Reads `::a::b`, `::{a, b::c}` after a path head; pushes every full path onto `out` and
/// returns the index after it.
fn path_tail(
    chars: &[char],
    mut i: usize,
    base: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut pushed = false;
    while i + 1 < chars.len() && chars[i] == ':' && chars[i + 1] == ':' {
        i += 2;
        if i < chars.len() && chars[i] == '{' {
            // A group: each item is a path relative to `base`.
            let mut depth = 1;
            let mut j = i + 1;
            while j < chars.len() && depth > 0 {
                match chars[j] {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                j += 1;
            }
            let inner: String = chars[i + 1..j.saturating_sub(1)].iter().collect();
            for item in split_top(&inner) {
                let item: Vec<char> = item.trim().chars().collect();
                let mut k = 0;
                let mut p = base.clone();
                while k < item.len() && is_ident(item[k]) {
                    let s = k;
                    while k < item.len() && is_ident(item[k]) {
                        k += 1;
                    }
                    let w: String = item[s..k].iter().collect();
                    if w == "self" {
                        break;
                    }
                    if w == "super" {
                        p.pop();
                    } else {
                        p.push(w);
                    }
                    if k + 1 < item.len() && item[k] == ':' && item[k + 1] == ':' {
                        k += 2;
                        if k < item.len() && item[k] == '{' {
                            let rest: String = item[k - 2..].iter().collect();
                            let rest: Vec<char> = rest.chars().collect();
                            path_tail(&rest, 0, &mut p.clone(), out);
                            break;
                        }
                    } else {
                        break;
                    }
                }
                out.push(p);
            }
            return j;
        }
        let s = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        if s == i {
            break;
        }
        let w: String = chars[s..i].iter().collect();
        if w == "super" {
            base.pop();
        } else {
            base.push(w);
        }
        pushed = true;
    }
    if pushed {
        out.push(base.clone());
    }
    i
}

/// Splits a `use` group's inside at its top-level commas.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

/// The import graph: file (by module path) to the files it names.
fn graph(files: &[File]) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let test_only = test_only_modules(files);
    let known: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let is_test =
        |m: &[String]| m.iter().any(|s| s == "tests") || test_only.iter().any(|t| m.starts_with(t));
    let mut edges = BTreeMap::new();
    for f in files.iter().filter(|f| !is_test(&f.module)) {
        let mut to = BTreeSet::new();
        for mut p in named_paths(&code_only(&f.text), &f.module) {
            while !p.is_empty() && !known.contains(&p) {
                p.pop();
            }
            if !p.is_empty() && p != f.module && !is_test(&p) {
                to.insert(p);
            }
        }
        edges.insert(f.module.clone(), to);
    }
    edges
}

/// Strongly connected components with more than one file (Tarjan), leaving out a module and
/// its direct child naming each other.
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct T<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<Vec<String>, usize>,
        low: BTreeMap<Vec<String>, usize>,
        on: BTreeSet<Vec<String>>,
        stack: Vec<Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit(t: &mut T<'_>, v: &Vec<String>) {
        t.index.insert(v.clone(), t.next);
        t.low.insert(v.clone(), t.next);
        t.next += 1;
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        let ws: Vec<Vec<String>> = t.edges.get(v).into_iter().flatten().cloned().collect();
        for w in ws {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
        .into_iter()
        .filter(|c| {
            let parent_child = c.len() == 2
                && (c[0].len() + 1 == c[1].len() && c[1].starts_with(&c[0])
                    || c[1].len() + 1 == c[0].len() && c[0].starts_with(&c[1]));
            !parent_child
        })
        .collect()
}

fn layer_of(top: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&top))
}

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "lib".into()
    } else {
        m.join("::")
    }
}

#[test]
fn imports_run_one_way() {
    let files = read_files();
    let edges = graph(&files);
    let found = circles(&edges);
    let text: Vec<String> = found
        .iter()
        .map(|c| c.iter().map(|m| show(m)).collect::<Vec<_>>().join(" -> "))
        .collect();
    assert!(
        found.is_empty(),
        "import circles in src/ (make the imports run one way, docs/architecture.md \"Layers\"):\n  {}",
        text.join("\n  ")
    );
    let mut upward = Vec::new();
    for (from, tos) in &edges {
        let Some(top) = from.first() else { continue };
        let Some(lf) = layer_of(top) else {
            upward.push(format!(
                "{}: top-level module {top} is in no layer of LAYERS",
                show(from)
            ));
            continue;
        };
        for to in tos {
            let Some(tt) = to.first() else { continue };
            if tt == top {
                continue;
            }
            match layer_of(tt) {
                Some(lt) if lt < lf => {}
                _ => upward.push(format!(
                    "{} imports {} (layer {lf} -> {:?})",
                    show(from),
                    show(to),
                    layer_of(tt)
                )),
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that do not run down the layers of tests/verification/structure.rs LAYERS:\n  {}",
        upward.join("\n  ")
    );
}

/// Functions in `code`: (name, lines from the `fn` line to its closing brace).
fn functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let t = t
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ");
        let Some(rest) = t.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        // Find the body's opening brace (a declaration ending in `;` has none).
        let mut depth = 0i64;
        let mut opened = false;
        for (j, body) in lines.iter().enumerate().skip(i) {
            for c in body.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    ';' if !opened && depth == 0 => break,
                    _ => {}
                }
            }
            if !opened && body.trim_end().ends_with(';') {
                break;
            }
            if opened && depth <= 0 {
                out.push((name.clone(), j - i + 1));
                break;
            }
        }
    }
    out
}

#[test]
fn files_and_functions_stay_small() {
    let files = read_files();
    let allowed: BTreeMap<&str, usize> = OVERSIZED.iter().copied().collect();
    let mut over = BTreeMap::new();
    for f in &files {
        let lines = f.text.lines().count();
        if lines > MAX_FILE_LINES {
            over.insert(f.rel.clone(), lines);
        }
        for (name, n) in functions(&code_only(&f.text)) {
            if n > MAX_FN_LINES {
                let key = format!("{}::{name}", f.rel);
                let e = over.entry(key).or_insert(0);
                *e = (*e).max(n);
            }
        }
    }
    let mut problems = Vec::new();
    for (k, n) in &over {
        match allowed.get(k.as_str()) {
            None => problems.push(format!(
                "{k}: {n} lines, over the limit ({MAX_FILE_LINES} per file, {MAX_FN_LINES} per function): split it"
            )),
            Some(&max) if *n > max => problems.push(format!(
                "{k}: {n} lines, more than the {max} it is allowed in OVERSIZED: split it, do not grow it"
            )),
            Some(_) => {}
        }
    }
    for (k, _) in OVERSIZED {
        if !over.contains_key(*k) {
            problems.push(format!(
                "{k} is back under the limit: remove it from OVERSIZED"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "sizes in src/:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn comments_cite_files_in_the_repository() {
    let mut hits = Vec::new();
    for f in read_files() {
        for (n, l) in f.text.lines().enumerate() {
            if l.contains("DESIGN.md") || l.contains("DESIGN §") {
                hits.push(format!("src/{}:{}", f.rel, n + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "these cite a design document that is not in the repository; cite the docs/ page instead:\n  {}",
        hits.join("\n  ")
    );
}

/// Repository paths cited in src/ (`docs/x.md`, `src/a/b.rs`, `tests/...`): each must exist.
#[test]
fn cited_files_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tops = [
        "docs/",
        "src/",
        "tests/",
        "benches/",
        "scripts/",
        "examples/",
        "deploy/",
    ];
    let ends = [".rs", ".md", ".sh", ".py", ".yaml", ".json", ".toml"];
    let mut missing = Vec::new();
    for f in read_files() {
        for (n, line) in f.text.lines().enumerate() {
            for top in tops {
                for (i, _) in line.match_indices(top) {
                    // A whole path: not the tail of a longer one (`diff/tests/x.rs`).
                    let before = line[..i].chars().next_back();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '_') {
                        continue;
                    }
                    let path: String = line[i..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || "/._-".contains(*c))
                        .collect();
                    let path = path.trim_end_matches('.');
                    if ends.iter().any(|e| path.ends_with(e)) && !root.join(path).exists() {
                        missing.push(format!("src/{}:{}: {path}", f.rel, n + 1));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "src/ cites files that do not exist (moved or renamed? cite the new path):\n  {}",
        missing.join("\n  ")
    );
}
