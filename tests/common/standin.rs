//! What the Python stand-ins of cloud KMSs (`tests/standins/*.py`, Python 3 standard library)
//! share in tests: the interpreter and the skip-or-fail check when it is missing, a running
//! stand-in (started on a port the system chooses, announced on one line `port <N>` of its
//! standard output, its standard error kept in a log file, killed on drop), and one plain
//! HTTP/1.1 request for the tests' direct reads and writes of a stand-in (an independent
//! witness: never through keyplan or a helper).
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// The Python 3 the tests run: `/usr/bin/python3` when present (a version manager's shim in
/// `PATH`, as a helper's `#!/usr/bin/env python3` line would find, can cost half a second per
/// run), else `python3`.
pub fn python() -> String {
    if std::path::Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3".into()
    } else {
        "python3".into()
    }
}

/// Is [`python`] there for `what` (a test, or what needs it)? Fails when
/// `KEYPLAN_REQUIRE_SERVERS=1` and it is not; otherwise prints "skipped: ..." and returns false.
pub fn python_available(what: &str) -> bool {
    let ok = Command::new(python())
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("KEYPLAN_REQUIRE_SERVERS").as_deref() != Ok("1"),
            "{what}: python3 is not installed, and the Python stand-ins and example helpers need it (KEYPLAN_REQUIRE_SERVERS=1 makes this a failure): install python3"
        );
        eprintln!(
            "skipped: {what}: python3 not found (the Python stand-ins and example helpers need it)"
        );
    }
    ok
}

/// A running Python stand-in.
pub struct Standin {
    child: Option<Child>,
    /// Holds `standin.log`, the stand-in's standard error.
    dir: tempfile::TempDir,
    /// Its loopback port.
    port: u16,
}

impl Standin {
    /// Starts `script` with `args` under [`python`] and waits for its line `port <N>` (or its
    /// exit). `None` when python3 is missing for `what` (see [`python_available`]).
    pub fn start(what: &str, script: &str, args: &[&str]) -> Option<Standin> {
        if !python_available(what) {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(dir.path().join("standin.log")).expect("standin.log");
        let mut child = Command::new(python())
            .arg(script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start the stand-in {script}: {e}"));
        // The event: one line `port <N>` once the socket listens (nothing if it exits first).
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line);
        let mut standin = Standin {
            child: Some(child),
            dir,
            port: 0,
        };
        match line.trim().strip_prefix("port ").map(str::parse) {
            Some(Ok(port)) => standin.port = port,
            _ => {
                standin.stop();
                panic!(
                    "the stand-in {script} did not announce its port ({line:?}); its log:\n{}",
                    standin.log()
                )
            }
        }
        Some(standin)
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it wrote on standard error so far (its request log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("standin.log")).unwrap_or_default()
    }

    /// Kills it (its state is in memory: gone).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// One HTTP/1.1 request to it with `headers` and `body` (connection closed after it):
    /// status and body.
    pub fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the stand-in");
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.port,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).expect("send");
        s.write_all(body).expect("send the body");
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("read the answer");
        let status = String::from_utf8_lossy(&out)
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{method} {path}: no status line from the stand-in"));
        let at = memchr::memmem::find(&out, b"\r\n\r\n").map_or(out.len(), |i| i + 4);
        (status, out[at..].to_vec())
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.stop();
    }
}
