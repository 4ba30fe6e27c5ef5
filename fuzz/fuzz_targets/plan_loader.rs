//! Plan-file loader: arbitrary bytes as a YAML and/or TOML plan (first byte picks the format),
//! errors rendered with miette. The harness is `keyplan::fuzzing::plan_loader`, which
//! `tests/verification/fuzz_corpus.rs` replays over the committed corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    keyplan::fuzzing::plan_loader(data);
});
